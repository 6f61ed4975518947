"""Submit a FedPC scaling sweep to Slurm: one batch job per rank count.

Usage (repo root)::

    python launch/slurm/submit_sweep.py --ranks 2,4,8,16,32 --out results/scaling \\
        --partition gpu --time 02:00:00 --gpus-per-task 1   # one GPU per rank
    python launch/slurm/submit_sweep.py --ranks 2,4 --out results/scaling   # CPU only (the default)
    python launch/slurm/submit_sweep.py --ranks 2,4 --dry-run      # write the scripts, submit nothing

Each job is ``launch/slurm/fedpc.sbatch`` with its ``#SBATCH`` header rendered for that rank
count (``--ntasks=R``, one task per rank, and ``--gpus-per-task`` GPUs per rank when asked for) and
``RANKS=R``; the rendered scripts are kept under ``OUT/slurm/`` for the record. The jobs are
independent (no ``--dependency``). When all have finished, aggregate every rank count with::

    python launch/sweep.py --ranks 2,4,8,16,32 --out results/scaling   # all cells done: only tables
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "fedpc.sbatch"
REPO = HERE.parents[1]


def render(template: str, ranks: int, *, out: str, modes: str = "strong,weak", seeds: str = "0",
           gpus_per_task: int = 0, cpus_per_task: int = 1, time: str = "02:00:00", partition: str | None = None,
           account: str | None = None, extra_args: str = "") -> str:
    """The batch script for ``ranks`` ranks: header lines replaced, run variables fixed.

    Args:
        template: text of ``fedpc.sbatch``.
        gpus_per_task: GPUs per rank; 0 (the default) requests none, as the template does.
        extra_args: more flags for ``launch/sweep.py`` (e.g. ``--assign tree --servers 2``).
    """
    if ranks < 2:
        raise ValueError(f"a FedPC job needs >= 2 ranks (server + client), got {ranks}")
    header = {"job-name": f"mpifc-fedpc-r{ranks}", "ntasks": str(ranks), "cpus-per-task": str(cpus_per_task),
              "time": time, "output": f"{out}/slurm/fedpc-r{ranks}-%j.out"}
    if gpus_per_task > 0:
        header["gpus-per-task"] = str(gpus_per_task)
    if partition:
        header["partition"] = partition
    if account:
        header["account"] = account
    lines, seen = [], set()
    for line in template.splitlines():
        m = re.match(r"#SBATCH --([\w-]+)=", line)
        if m:
            key = m.group(1)
            if key in header:
                lines.append(f"#SBATCH --{key}={header[key]}")
                seen.add(key)
            continue  # a header line we do not set (e.g. gpus-per-task=0) is dropped
        lines.append(line)
    # Keys the template lacks (partition, account) go after the last #SBATCH line kept.
    missing = [f"#SBATCH --{k}={v}" for k, v in header.items() if k not in seen]
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH")) if seen else 1
    lines[last + 1:last + 1] = missing
    fixed = {"RANKS": str(ranks), "OUT": out, "MODES": modes, "SEEDS": seeds, "EXTRA_ARGS": extra_args}
    out_lines = []
    for line in lines:
        m = re.match(r'^(\w+)="\$\{\1:-.*\}"$', line)
        if m and m.group(1) in fixed:
            line = f"{m.group(1)}={shlex.quote(fixed[m.group(1)])}"
        out_lines.append(line)
    return "\n".join(out_lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="launch/slurm/submit_sweep.py", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4,8,16,32", help="rank counts, comma-separated")
    p.add_argument("--out", default="results/scaling")
    p.add_argument("--modes", default="strong,weak")
    p.add_argument("--seeds", default="0")
    p.add_argument("--gpus-per-task", type=int, default=0, help="GPUs per rank (default 0: CPU only)")
    p.add_argument("--cpus-per-task", type=int, default=1)
    p.add_argument("--time", default="02:00:00")
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--extra-args", default="", help="more flags for launch/sweep.py, quoted")
    p.add_argument("--dry-run", action="store_true", help="write the scripts, do not call sbatch")
    a = p.parse_args(argv)
    try:
        ranks = [int(r) for r in a.ranks.split(",") if r.strip()]
    except ValueError:
        print(f"submit_sweep: --ranks {a.ranks!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    if not ranks or min(ranks) < 2:
        print(f"submit_sweep: --ranks {a.ranks!r}: every rank count must be >= 2", file=sys.stderr)
        return 2
    if a.gpus_per_task < 0 or a.cpus_per_task < 1:
        print(f"submit_sweep: --gpus-per-task {a.gpus_per_task} / --cpus-per-task {a.cpus_per_task}: "
              "need >= 0 GPUs and >= 1 CPU per task", file=sys.stderr)
        return 2
    template = TEMPLATE.read_text()
    script_dir = Path(a.out) / "slurm"
    script_dir.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        text = render(template, r, out=a.out, modes=a.modes, seeds=a.seeds, gpus_per_task=a.gpus_per_task,
                      cpus_per_task=a.cpus_per_task, time=a.time, partition=a.partition, account=a.account,
                      extra_args=a.extra_args)
        path = script_dir / f"fedpc-r{r}.sbatch"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if a.dry_run:
            print(f"wrote {path}")
            continue
        try:
            res = subprocess.run(["sbatch", str(path)], capture_output=True, text=True, cwd=REPO)
        except FileNotFoundError:
            print("submit_sweep: no sbatch on PATH: submit from a Slurm login node, bring up "
                  "launch/slurm/local-cluster.sh, or use --dry-run", file=sys.stderr)
            return 2
        if res.returncode != 0:
            print(f"submit_sweep: sbatch {path} failed: {res.stderr.strip()}", file=sys.stderr)
            return 1
        print(f"{r} ranks: {res.stdout.strip()} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
