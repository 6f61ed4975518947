"""A dispatch-loop actor: handlers registered per message kind, clean shutdown.

Example (server side)::

    actor = Actor(ctx.transport)

    @actor.on(LIKELIHOODS)
    def got_likelihoods(src: int, value: np.ndarray) -> None:
        ...

    actor.run(peers=ctx.roles.clients)   # returns once every client has sent SHUTDOWN

A client sends its messages and finally ``actor_stop(transport, [server])``.

MPI keeps messages in order only within one tag, and every kind has its own tag, so a SHUTDOWN
can overtake a message of another kind sent before it. The SHUTDOWN therefore carries how many
messages of each kind its sender has sent to this rank; the actor keeps serving that peer until
it has received them all.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from mpifc.runtime.kinds import SHUTDOWN, MessageKind, as_kind

Handler = Callable[[int, Any], None]


class Actor:
    """Receives messages of the registered kinds and calls their handlers, in arrival order.

    Args:
        transport: the rank's :class:`~mpifc.runtime.transport.Transport`.
    """

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._handlers: dict[int, tuple[MessageKind, Handler]] = {}
        self._stop = False

    def on(self, kind: MessageKind | str, handler: Handler | None = None) -> Any:
        """Register ``handler(src, value)`` for ``kind``; usable as a decorator."""
        k = as_kind(kind)
        if k.kind_id == SHUTDOWN.kind_id:
            raise ValueError("runtime.shutdown is handled by the actor itself")

        def register(h: Handler) -> Handler:
            self._handlers[k.kind_id] = (k, h)
            return h

        return register(handler) if handler is not None else register

    def exit(self) -> None:
        """Called from a handler: leave :meth:`run` after this message."""
        self._stop = True

    def _drained(self, src: int, announced: dict[int, int]) -> bool:
        got = self.transport.received_counts
        return all(got.get((src, kid), 0) >= n for kid, n in announced.items() if kid in self._handlers)

    def run(self, peers: Iterable[int]) -> int:
        """Dispatch messages until every rank in ``peers`` has sent SHUTDOWN (or :meth:`exit`).

        Every wait honours the transport deadline, whose error names the ranks still open.

        Returns:
            The number of messages handled (shutdowns excluded).
        """
        open_peers = set(int(p) for p in peers)
        draining: dict[int, dict[int, int]] = {}
        handled = 0
        self._stop = False
        while (open_peers or draining) and not self._stop:
            kinds = [k for k, _ in self._handlers.values()]
            if open_peers:
                kinds.append(SHUTDOWN)
            sources = sorted(open_peers | set(draining))
            src, kind, value = self.transport.recv_any_kind(kinds, sources=sources)
            if kind.kind_id == SHUTDOWN.kind_id:
                open_peers.discard(src)
                announced = {int(k): int(n) for k, n in (value or {}).items()}
                if not self._drained(src, announced):
                    draining[src] = announced
                continue
            self._handlers[kind.kind_id][1](src, value)
            handled += 1
            if src in draining and self._drained(src, draining[src]):
                del draining[src]
        return handled


def actor_stop(transport: Any, dests: Iterable[int]) -> None:
    """Tell each rank in ``dests`` that this rank will send its actor nothing more.

    The message carries ``{kind id: messages sent to that rank}`` so the actor can wait for any
    message the SHUTDOWN overtook.
    """
    for d in dests:
        counts = {kid: n for (dest, kid), n in transport.sent_counts.items()
                  if dest == d and kid != SHUTDOWN.kind_id}
        transport.send_obj(counts, d, SHUTDOWN)
