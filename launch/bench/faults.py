"""The fault matrix: every phase of a FedPC job crossed with every fault, and how each job ends.

Run (from the repo root, venv python)::

    python launch/bench/faults.py [--liveness 3] [--parallel 3] [--out faults.csv]

For each cell a real ``mpiexec -n 3`` job (a server and two clients on breast-cancer shards,
``--learner factorized``) runs with ``MPIFC_FAULT=RANK:PHASE:KIND`` (:mod:`mpifc.runtime.faults`):
the phases ``startup`` (before MPI is up), ``read``, ``learn``, ``gather`` and ``write``
(assembling and writing the model) of ``mpifc train``, and ``query`` of ``mpifc evaluate
--distributed``; the faults are SIGKILL, SIGSTOP, an exception and an early return, of a client
(rank 2) or of the server (rank 0).

Columns: ``seconds`` from the fault (the time the faulting rank noted just before it) to the end
of ``mpiexec``; ``exit`` code; ``named``: whether a line of stderr starting ``mpifc: rank R``
names the faulting rank; ``lines``: how many lines start with ``mpifc:`` (the goal: one);
``leftovers``: processes of the job still alive a few seconds after
``mpiexec`` ended (the ranks' and the node sentinel's process ids, noted by the job itself), and
output files at their final paths or partial files beside them. ``ok`` is every check of
``tests/reliability``: exit code not 0, ended within ``liveness + 5`` s of the fault, rank
named in one line, no leftovers. The exit status is 0 only if every cell is ok.
"""

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHASES = ("startup", "read", "learn", "gather", "write", "query")
FAULTS = {  # label -> (role, kind)
    "client sigkill": ("client", "sigkill"), "server sigkill": ("server", "sigkill"),
    "client sigstop": ("client", "sigstop"), "server sigstop": ("server", "sigstop"),
    "client raise": ("client", "raise"), "server raise": ("server", "raise"),
    "client return": ("client", "return"), "server return": ("server", "return"),
}
RANKS = {"server": 0, "client": 2}
N_RANKS = 3


@dataclass
class Cell:
    """How one faulted job ended."""

    phase: str
    fault: str
    rank: int
    injected: bool = False
    seconds: float | None = None
    exit: int | None = None
    named: bool = False
    lines: int = 0
    line: str = ""
    leftovers: list[str] = field(default_factory=list)
    ok: bool = False


def _mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else "mpiexec"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MPIFC_FAULT", None)
    env.pop("MPIFC_FAULT_LOG", None)
    env.update(extra or {})
    return env


def prepare(work: Path, liveness: float) -> tuple[Path, Path]:
    """Breast-cancer shards for two clients and a model trained on them (for the query cells)."""
    shards, model = work / "shards", work / "model.h5"
    if not (shards / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "data_prep", "--dataset", "breast-cancer", "--setting", "horizontal",
                        "--clients", str(N_RANKS - 1), "--seed", "0", "--out", str(shards)],
                       check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
    if not model.is_file():
        subprocess.run([_mpiexec(), "-n", str(N_RANKS), sys.executable, "-m", "mpifc", "train", str(shards),
                        "--learner", "factorized", "--seed", "0", "--model", str(model), "--liveness", str(liveness)],
                       check=True, capture_output=True, env=_env(), cwd=REPO, timeout=300)
    return shards, model


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def named_in(stderr: str, rank: int) -> tuple[bool, str]:
    """Whether a line ``mpifc: rank R ...`` (or ``mpifc: ranks A, R ...``) names ``rank``; the line."""
    for line in stderr.splitlines():
        m = re.match(r"mpifc: ranks? (\d+(?:, \d+)*)", line)
        if m and rank in {int(t) for t in m.group(1).split(", ")}:
            return True, line
    first = next((ln for ln in stderr.splitlines() if ln.startswith("mpifc:")), "")
    return False, first


def run_cell(phase: str, fault: str, shards: Path, model: Path, work: Path, liveness: float,
             timeout: float = 120.0) -> Cell:
    """Run one faulted job and check how it ended (see the module docstring)."""
    role, kind = FAULTS[fault]
    rank = RANKS[role]
    cell = Cell(phase, fault, rank)
    d = work / f"{phase}-{fault.replace(' ', '-')}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    log, out = d / "log", d / "out"
    out.mkdir(exist_ok=True)
    if phase == "query":
        args = ["evaluate", str(shards), "--model", str(model), "--distributed", "--ledger", str(out / "query.csv"),
                "--output-npz", str(out / "joint.npz")]
        finals = [out / "query.csv", out / "joint.npz"]
    else:
        args = ["train", str(shards), "--learner", "factorized", "--seed", "0", "--model", str(out / "model.h5"),
                "--ledger", str(out / "train.csv")]
        finals = [out / "model.h5", out / "train.csv"]
    cmd = [_mpiexec(), "-n", str(N_RANKS), sys.executable, "-m", "mpifc", *args, "--liveness", f"{liveness:g}"]
    env = _env({"MPIFC_FAULT": f"{rank}:{phase}:{kind}", "MPIFC_FAULT_LOG": str(log)})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        cell.leftovers.append(f"job still running after {timeout:g} s")
    ended = time.time()
    cell.exit = proc.returncode
    fault_file = log / "fault"
    if fault_file.is_file():
        cell.injected = True
        cell.seconds = ended - float(fault_file.read_text().split()[3])
    cell.named, cell.line = named_in(err, rank)
    cell.lines = sum(1 for ln in err.splitlines() if ln.startswith("mpifc:"))
    pids = {p.name: int(p.read_text()) for p in log.glob("*.pid")} if log.is_dir() else {}
    until = time.time() + 5.0
    while time.time() < until and any(_alive(p) for p in pids.values()):
        time.sleep(0.05)
    for name, pid in sorted(pids.items()):
        if _alive(pid):
            cell.leftovers.append(f"process {name[:-4]} (pid {pid})")
            try:
                os.kill(pid, signal.SIGKILL)  # do not leave it running on the machine
            except OSError:
                pass
    cell.leftovers += [f"file {p.name}" for p in finals if p.exists()]
    cell.leftovers += [f"partial {p.name}" for p in out.iterdir() if ".partial-" in p.name]
    cell.ok = (cell.injected and cell.exit not in (0, None) and cell.seconds is not None
               and cell.seconds <= liveness + 5.0 and cell.named and cell.lines == 1 and not cell.leftovers)
    return cell


def run_matrix(work: Path, liveness: float, parallel: int = 3, phases=PHASES, faults=tuple(FAULTS)) -> list[Cell]:
    """Every (phase, fault) cell, ``parallel`` jobs at a time."""
    work.mkdir(parents=True, exist_ok=True)
    shards, model = prepare(work, liveness)
    cells = [(p, f) for p in phases for f in faults]
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(lambda pf: run_cell(pf[0], pf[1], shards, model, work, liveness), cells))


def table(cells: list[Cell]) -> str:
    lines = [f"{'phase':8s} {'fault':15s} {'rank':>4s} {'seconds':>8s} {'exit':>5s} {'named':>6s} {'lines':>5s}  leftovers"]
    for c in cells:
        secs = f"{c.seconds:8.2f}" if c.seconds is not None else "       -"
        lines.append(f"{c.phase:8s} {c.fault:15s} {c.rank:4d} {secs} {str(c.exit):>5s} {'yes' if c.named else 'NO':>6s}"
                     f" {c.lines:5d}  {', '.join(c.leftovers) or 'none'}{'' if c.ok else '   <- FAILED'}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--liveness", type=float, default=3.0, help="--liveness of every job (default 3)")
    ap.add_argument("--parallel", type=int, default=3, help="jobs at a time (default 3)")
    ap.add_argument("--work", default=None, help="working folder (default: a new temp folder)")
    ap.add_argument("--out", default=None, help="CSV of every cell")
    args = ap.parse_args()
    import tempfile

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mpifc-faults-"))
    t0 = time.time()
    cells = run_matrix(work, args.liveness, args.parallel)
    print(table(cells))
    bad = sum(not c.ok for c in cells)
    print(f"{len(cells)} cells, {len(cells) - bad} ok, {bad} failed; --liveness {args.liveness:g}, "
          f"{args.parallel} jobs at a time, {time.time() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(cells[0])))
            w.writeheader()
            for c in cells:
                w.writerow({**asdict(c), "leftovers": "; ".join(c.leftovers)})
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
