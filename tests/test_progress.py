"""Progress lines (:mod:`mpifc.progress`): a line after every stretch of silence, none while a
phase reports itself, and nothing at all where no ticker runs."""
from __future__ import annotations

import io
import re
import time

import mpifc.progress as progress


def test_silence_is_broken_by_a_line_and_a_quiet_phase_stays_quiet():
    out = io.StringIO()
    with progress.Ticker("prog", stream=out, every=0.3) as t:
        progress.phase(lambda: "step 1 of 3")
        time.sleep(1.2)
        lines = out.getvalue().splitlines()
        assert len(lines) >= 2 and all(re.fullmatch(r"prog: step 1 of 3 \.\.\. \[\d+ s\]", x) for x in lines), lines
        progress.phase("EM", quiet=True)
        n = len(out.getvalue().splitlines())
        time.sleep(0.8)
        assert len(out.getvalue().splitlines()) == n  # the phase reports itself
        t.say("iteration 1")
    assert out.getvalue().splitlines()[-1] == "prog: iteration 1"
    assert not progress.running()


def test_without_a_ticker_phase_and_say_do_nothing(capsys):
    progress.phase("nothing")
    progress.say("nothing")
    with progress.ticker("prog", enabled=False) as t:
        t.phase("x")
        t.say("y")
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
