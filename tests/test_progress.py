"""Progress lines (:mod:`mpifc.progress`): a line after every stretch of silence, even while the
command holds the GIL; none in a phase that reports itself; nothing where no ticker runs; and
the helper process ends with the command, however it ends."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import mpifc.progress as progress
from tests.mpi_util import REPO

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import mpifc.progress as progress
    with progress.Ticker("prog", every=0.3) as t:
        print("helper", t._proc.pid, flush=True)
        done = [0]
        progress.phase(lambda: f"step {done[0]} of 3")
        time.sleep(1.0)
        done[0] = 1
        time.sleep(1.2)  # the text follows the phase's own count
        sys.setswitchinterval(1000)  # hold the GIL in a pure-Python loop for 2 s
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass
        sys.setswitchinterval(0.005)
        progress.say("GIL released")
        progress.phase("EM", quiet=True)
        time.sleep(1.0)
        progress.say("iteration 1")
        if "hang" in sys.argv:
            time.sleep(60)
    print("done", flush=True)
""")


def run_script(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], stdout=subprocess.PIPE, text=True, env=env)


def test_silence_is_broken_by_a_line_even_while_the_gil_is_held_and_a_quiet_phase_stays_quiet():
    proc = run_script()
    stamped = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    assert proc.wait(timeout=60) == 0
    lines = [line for _, line in stamped]
    assert lines[-3:] == ["prog: GIL released", "prog: iteration 1", "done"], lines
    ticks = [line for line in lines if line.startswith("prog: step")]
    assert all(re.fullmatch(r"prog: step [01] of 3 \.\.\. \[\d+ s\]", x) for x in ticks), ticks
    assert "prog: step 1 of 3" in " ".join(ticks)
    # lines came during the 2 s the GIL was held: between the last tick before it and the release
    t_release = next(t for t, line in stamped if line == "prog: GIL released")
    assert sum(1 for t, line in stamped if line.startswith("prog: step") and t > t_release - 1.8) >= 2, stamped
    # nothing between "GIL released" and "iteration 1": the EM phase reports itself
    i = lines.index("prog: GIL released")
    assert lines[i + 1] == "prog: iteration 1"


def test_the_helper_ends_with_the_command_when_it_is_killed():
    proc = run_script("hang")
    helper = int(proc.stdout.readline().split()[1])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{helper}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # ended; only its exit status waits to be collected
            return
        time.sleep(0.1)
    raise AssertionError(f"helper {helper} still runs after its command was killed")


def test_without_a_ticker_phase_and_say_do_nothing(capsys):
    progress.phase("nothing")
    progress.say("nothing")
    with progress.ticker("prog", enabled=False) as t:
        t.phase("x")
        t.say("y")
    out = capsys.readouterr()
    assert out.out == "" and out.err == "" and not progress.running()
