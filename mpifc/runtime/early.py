"""The first thing the ``mpifc`` command does under a launcher, before any other import.

A rank killed, frozen or signalled while Python still imports the command can be named only by
a process that watches it from outside, and only from the moment that process looks: the node
sentinel (:mod:`mpifc.runtime.sentinel`). So the command's first lines (:mod:`mpifc.cli`) call
:func:`take`, which uses the standard library's ``os`` and ``signal`` alone, and:

* blocks SIGINT, SIGTERM and SIGUSR1 in the main thread, so that a Ctrl-C or a ``kill`` that
  comes while the command imports stays pending for the signal thread
  (:mod:`mpifc.runtime.signals`) instead of raising ``KeyboardInterrupt`` in an import or
  ending the process without a word;
* closes the launcher daemon's own control socket, which MPICH's hydra leaves open in every
  rank it starts (``HYDI_CONTROL_FD``): while any process holds it, ``mpiexec`` cannot see its
  daemon die, and a daemon killed as the ranks start would leave ``mpiexec`` waiting for ranks
  that still import (measured on a loaded node: 7 to 12 s);
* ends at once, without a word, a rank whose launcher daemon is already gone (see
  :func:`launcher_gone`): ``mpiexec`` has reported the failure, nobody reads this rank's output
  any more, and nothing of the job is this rank's to clean up yet;
* finds the node folder (named after the launcher daemon the ranks descend from and its start
  time); the node's first rank starts the sentinel with ``posix_spawn`` and ``setsid``, apart
  from the ranks' process group, and the sentinel makes the folder (:func:`meet`); then the
  rank registers (``rank-R``: its process id), here if the folder is already there, else once
  its imports are done (:meth:`mpifc.runtime.node.NodeView.join`).

What remains unwatched is the interpreter's own start (before the command's first line runs)
and the sentinel's (until its first look at the launcher's children): a rank killed there takes
the other ranks with it (the launcher kills them with SIGKILL within milliseconds), and no
process of the job is left that saw it go.
"""
from __future__ import annotations

import os

LAUNCHER_PROCESSES = ("hydra_pmi_proxy", "orted", "prted", "slurmstepd")
"""Process names of the launchers' per-node daemons that start the ranks."""
LAUNCHER_COMMANDS = ("mpiexec", "mpirun", "prterun", "orterun")
"""Names (prefixes) of the commands a user runs that start those daemons (``mpiexec.hydra`` too)."""
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
"""Variables that launchers set to this process's rank."""

DEFAULT_LIMIT_S = 10.0
"""The default ``--liveness``, seconds (:mod:`mpifc.runtime.liveness`)."""

_started: dict[str, object] = {}  # what take() did: folder, sentinel pid


def env_rank(environ=None) -> int | None:
    """This process's rank as the launcher put it in the environment, if any (MPI not needed)."""
    env = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        v = env.get(name)
        if v is not None and v.isdigit():
            return int(v)
    return None


def _stat_fields(pid: int) -> tuple[str, list[str]] | None:
    """``(comm, fields after comm)`` of ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    lo, hi = text.find("("), text.rfind(")")
    if lo < 0 or hi < 0:
        return None
    return text[lo + 1: hi], text[hi + 2:].split()


def launcher_process(max_depth: int = 6) -> tuple[int, str] | None:
    """``(pid, start time)`` of the nearest ancestor that is a launcher daemon, or None.

    Walks up from the parent, so wrappers between the daemon and the rank (``timeout``, a
    shell) do not matter.
    """
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return None
        info = _stat_fields(pid)
        if info is None:
            return None
        comm, rest = info
        if comm in LAUNCHER_PROCESSES:
            return pid, rest[19]  # field 22 of stat: start time in clock ticks since boot
        pid = int(rest[1])
    return None


def launcher_chain(daemon: int) -> list[tuple[str, int]]:
    """``[(name, pid)]`` of the launcher processes to watch: the per-node daemon ``daemon``, then
    its parent if that is the ``mpiexec`` the user ran (on this node)."""
    info = _stat_fields(daemon)
    if info is None:
        return []
    chain = [(info[0], daemon)]
    parent = int(info[1][1])
    up = _stat_fields(parent) if parent > 1 else None
    if up is not None and up[0].startswith(LAUNCHER_COMMANDS):
        chain.append((up[0], parent))
    return chain


def _tasks_on_node(spec: str, node: int) -> int | None:
    """Slurm's ``SLURM_STEP_TASKS_PER_NODE`` (e.g. ``"4(x2),3"``) for node index ``node``."""
    counts: list[int] = []
    for part in spec.split(","):
        n, _, rep = part.partition("(x")
        try:
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        except ValueError:
            return None
    return counts[node] if 0 <= node < len(counts) else None


def local_rank_count(environ=None) -> int | None:
    """How many ranks the launcher started on this node, from its environment, or None."""
    env = os.environ if environ is None else environ
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        v = env.get(name, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE"), env.get("SLURM_NODEID", "")
    if spec and node.isdigit():
        return _tasks_on_node(spec, int(node))
    return None


def base_folder() -> str:
    """Where node folders live: ``/dev/shm`` where it is writable, else the temp folder."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    import tempfile

    return tempfile.gettempdir()


def node_folder(launcher: tuple[int, str]) -> str:
    """The node folder of the job whose launcher daemon is ``(pid, start time)``."""
    pid, start = launcher
    return os.path.join(base_folder(), f"mpifc-{os.getuid()}-{pid}-{start}")


def liveness_in(argv: list[str], default_s: float) -> float:
    """The ``--liveness`` of a command line (``default_s`` if absent or not a positive number)."""
    limit = default_s
    for i, a in enumerate(argv):
        text = a.split("=", 1)[1] if a.startswith("--liveness=") else (argv[i + 1] if a == "--liveness" and
                                                                       i + 1 < len(argv) else None)
        if text is not None:
            try:
                limit = float(text) if float(text) > 0 else default_s
            except ValueError:
                pass
    return limit


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file beside it (a reader sees all of it or none)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def keep_descriptors() -> None:
    """Let no descriptor of this process but standard input, output and error pass to a program
    it starts (the launcher's PMI socket is the rank's alone)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


def drop_launcher_control(environ=None) -> None:
    """Close the control socket of MPICH's launcher daemon (``hydra_pmi_proxy``) that this rank
    inherited (``HYDI_CONTROL_FD``; the rank's own channel to it is ``PMI_FD``), and drop the
    variable, so that no process this rank starts takes the number for its own. ``mpiexec``
    sees its daemon end only once no process holds that socket."""
    env = os.environ if environ is None else environ
    text = env.get("HYDI_CONTROL_FD", "")
    if not text.isdigit() or int(text) <= 2 or text == env.get("PMI_FD"):
        return
    import stat

    try:
        if stat.S_ISSOCK(os.fstat(int(text)).st_mode):
            os.close(int(text))
    except OSError:
        return
    env.pop("HYDI_CONTROL_FD", None)


def launcher_gone(environ=None) -> bool:
    """Whether the launcher daemon that started this rank has ended: the daemon's end of the
    rank's PMI socket (``PMI_FD``, MPICH's hydra) has hung up, or this process was handed to
    init. Before ``MPI_Init`` only (the socket is MPI's from then on)."""
    env = os.environ if environ is None else environ
    text = env.get("PMI_FD", "")
    if text.isdigit():
        import select

        poller = select.poll()
        poller.register(int(text), select.POLLIN | getattr(select, "POLLRDHUP", 0))
        try:
            events = poller.poll(0)
        except OSError:
            events = []
        hung_up = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
        if any(ev & hung_up and not ev & select.POLLNVAL for _, ev in events):
            return True
    return os.getppid() == 1


CLAIM_ENV = "MPIFC_SENTINEL_CLAIM"
"""Set for a sentinel started with the node's claim (:func:`meet`): the descriptor it holds it on."""
CLAIM_FD = 3


def start_sentinel(folder: str, limit_s: float, local_ranks: int, launchers: list[tuple[str, int]],
                   claim: int | None = None) -> int:
    """Start the node sentinel on ``folder`` with ``setsid``, apart from the ranks' process group
    (the launcher's kill of the ranks must not reach it), with this rank's standard error (call
    :func:`keep_descriptors` first); returns its process id. ``claim``: the descriptor of the
    node's claim (:func:`meet`), which the sentinel holds for its life and makes the folder."""
    import sys

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sentinel.py")
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    env = os.environ
    if claim is not None:
        actions.append((os.POSIX_SPAWN_DUP2, claim, CLAIM_FD))
        env = {**os.environ, CLAIM_ENV: str(CLAIM_FD)}
    return os.posix_spawn(
        sys.executable, [sys.executable, "-I", "-S", script, folder, repr(float(limit_s)), str(local_ranks),
                         *(f"{name}:{pid}" for name, pid in launchers)],
        env, setsid=True, setsigmask=set(), file_actions=actions)


def _claim(folder: str):
    """The node's claim: the right to start its sentinel, an abstract Unix socket named after
    ``folder`` (Linux), bound by one process at a time and gone with the last process that holds
    it, so a rank killed while it claims leaves nothing behind. The socket if this process got
    it, None if another process holds it, ``False`` where there are no abstract sockets."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.bind("\0" + folder)
    except OSError as e:
        sock.close()
        import errno

        return None if e.errno == errno.EADDRINUSE else False
    return sock


def meet(folder: str, limit_s: float, local_ranks: int, launchers: list[tuple[str, int]],
         wait_s: float = 0.0) -> bool:
    """See that the node folder exists with a sentinel on it: the first rank to get the node's
    claim (:func:`_claim`) starts the sentinel, which makes the folder; the others wait for it (at
    most ``wait_s``). True once the folder exists.

    The folder never exists without a sentinel: a rank killed between making it and starting the
    sentinel (the launcher kills the ranks of a node together, within milliseconds) would leave
    it behind with nobody to remove it. A claim whose holder is killed, or a sentinel killed
    before it made the folder, lets the next rank try again."""
    import time

    until = time.monotonic() + wait_s
    pause = 0.001
    while not os.path.isdir(folder):
        got = _claim(folder)
        if got is False:  # no abstract sockets: make the folder and start the sentinel at once
            try:
                os.mkdir(folder, 0o700)
                _started["sentinel"] = start_sentinel(folder, limit_s, local_ranks, launchers)
            except FileExistsError:
                pass
            continue
        if got is not None:
            keep_descriptors()
            try:
                _started["sentinel"] = start_sentinel(folder, limit_s, local_ranks, launchers, got.fileno())
            finally:
                got.close()
        if time.monotonic() >= until:
            return os.path.isdir(folder)
        time.sleep(pause)
        pause = min(pause * 1.5, 0.02)
    return True


def take(argv: list[str], default_limit_s: float) -> str | None:
    """Under a launcher, at once: hold SIGINT, SIGTERM and SIGUSR1 for the signal thread, meet
    the node (starting its sentinel if this is the node's first rank) and register this rank;
    returns the node folder (None where there is no launcher to find). Once per process."""
    if "folder" in _started:
        return _started["folder"]  # type: ignore[return-value]
    rank = env_rank()
    if rank is None:
        return None
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})
    _started["folder"] = None
    drop_launcher_control()
    if local_rank_count() is not None and launcher_gone():
        os._exit(1)  # the launcher's daemon is gone: mpiexec reported it, and nobody hears this rank
    local, launcher = local_rank_count(), launcher_process()
    if local is None or launcher is None:
        return None
    folder = node_folder(launcher)
    limit = liveness_in(argv, default_limit_s)
    chain = launcher_chain(launcher[0])
    keep_descriptors()
    try:  # the node's first rank starts the sentinel, which makes the folder; the rank goes on meanwhile
        if not meet(folder, limit, local, chain):
            return folder  # registers once the folder is there (mpifc.runtime.node.NodeView.join)
        write_atomic(os.path.join(folder, f"rank-{rank}"), str(os.getpid()))
    except OSError:
        return None
    _started["folder"] = folder
    return folder


def sentinel_started() -> int | None:
    """The process id of the sentinel :func:`take` started, or None."""
    pid = _started.get("sentinel")
    return pid if isinstance(pid, int) else None
