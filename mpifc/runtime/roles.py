"""Which ranks are servers and which are clients."""
from __future__ import annotations

from dataclasses import dataclass

from mpifc.errors import UserError


@dataclass(frozen=True)
class Roles:
    """The role of every rank of a job.

    Rank 0 is the (first) server. A job spec may declare more server ranks, since ψ can place
    inner circuit nodes on several servers; every other rank is a client.

    Attributes:
        servers: server ranks, sorted; ``servers[0]`` is the coordinator.
        clients: client ranks, sorted.
    """

    servers: tuple[int, ...]
    clients: tuple[int, ...]

    @classmethod
    def build(cls, size: int, servers: tuple[int, ...] | list[int] | int = (0,), min_clients: int = 0) -> "Roles":
        """Roles for a job of ``size`` ranks.

        Args:
            size: number of ranks.
            servers: server ranks, or how many (then ranks ``0..n-1``).
            min_clients: the job needs at least this many client ranks.

        Raises:
            UserError: a server rank outside the job, or too few ranks for the clients needed.
        """
        if isinstance(servers, int):
            servers = tuple(range(servers))
        srv = tuple(sorted(set(int(s) for s in servers)))
        if not srv:
            raise UserError("job spec: at least one server rank is needed")
        bad = [s for s in srv if not 0 <= s < size]
        if bad:
            raise UserError(f"job spec: server rank(s) {bad} outside this job's ranks 0..{size - 1}")
        clients = tuple(r for r in range(size) if r not in srv)
        if len(clients) < min_clients:
            need = len(srv) + min_clients
            raise UserError(f"too few ranks: this job needs {need} ({len(srv)} server(s) + {min_clients} "
                            f"client(s)) but mpiexec started {size}; run with mpiexec -n {need} or more")
        return cls(servers=srv, clients=clients)

    @property
    def coordinator(self) -> int:
        """The first server rank (rank 0 by default)."""
        return self.servers[0]

    def is_server(self, rank: int) -> bool:
        return rank in self.servers

    def is_client(self, rank: int) -> bool:
        return rank in self.clients

    def role_of(self, rank: int) -> str:
        """``"server"`` or ``"client"``."""
        return "server" if rank in self.servers else "client"
