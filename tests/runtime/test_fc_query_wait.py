"""The polite waits of the distributed query loop (mpifc.fedpc.query), in one process with a
scripted transport: arrival order, one message per source, deadlines, pending sends."""
from __future__ import annotations

import numpy as np
import pytest

from mpifc.fedpc import protocol as P
from mpifc.fedpc.query import await_messages, await_sends
from mpifc.runtime.transport import DeadlineExceeded


class ScriptedTransport:
    """``try_recv`` answers from per-source queues; a message becomes visible after its source
    has been polled ``delay[src]`` times (so sources "arrive" in a chosen order)."""

    def __init__(self, queues: dict[int, list[np.ndarray]], delay: dict[int, int], deadline: float = 5.0):
        self.queues, self.delay, self.deadline, self.rank = queues, dict(delay), deadline, 0
        self.polls: list[int] = []

    def try_recv(self, src: int, kind):
        assert kind is P.VALUES
        self.polls.append(src)
        if self.delay.get(src, 0) > 0:
            self.delay[src] -= 1
            return False, None
        if not self.queues[src]:
            return False, None
        return True, self.queues[src].pop(0)


def test_await_messages_takes_one_per_source_in_arrival_order():
    q = {1: [np.full(3, 1.0), np.full(3, 11.0)], 2: [np.full(3, 2.0)], 3: [np.full(3, 3.0)]}
    t = ScriptedTransport(q, delay={1: 5, 2: 0, 3: 2})
    got = await_messages(t, [1, 2, 3], P.VALUES)
    assert [s for s, _ in got] == [2, 3, 1]
    assert [float(v[0]) for _, v in got] == [2.0, 3.0, 1.0]
    # Source 1's next message (a later batch) is left for the next call.
    assert len(q[1]) == 1 and float(q[1][0][0]) == 11.0
    assert await_messages(t, [], P.VALUES) == []


def test_await_messages_deadline_names_missing_ranks():
    t = ScriptedTransport({1: [np.zeros(2)], 4: []}, delay={}, deadline=0.05)
    with pytest.raises(DeadlineExceeded, match=r"\[4\]"):
        await_messages(t, [1, 4], P.VALUES)


class Pending:
    def __init__(self, polls_until_done: int):
        self.left, self.waited = polls_until_done, False

    def done(self) -> bool:
        self.left -= 1
        return self.left < 0

    def wait(self) -> None:
        assert self.left < 0, "wait() before the send completed would block inside MPI"
        self.waited = True


def test_await_sends_polls_until_every_send_completed():
    ps = [Pending(3), Pending(0), Pending(7)]
    pending = list(ps)
    await_sends(ScriptedTransport({}, {}), pending)
    assert pending == [] and all(p.waited for p in ps)
