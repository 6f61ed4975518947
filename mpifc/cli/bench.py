"""``mpifc bench NAME [ARGS...]``: run ``launch/bench/NAME.py`` from a source checkout."""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from mpifc.errors import UserError

BENCH_DIR = Path(__file__).resolve().parents[2] / "launch" / "bench"


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc bench``: a benchmark name and its own arguments."""
    p.add_argument("name", help="benchmark name: a file launch/bench/<name>.py")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark")


def bench_main(args: argparse.Namespace) -> int:
    """Run ``launch/bench/<name>.py`` (from a source checkout) with the remaining arguments."""
    script = BENCH_DIR / f"{args.name}.py"
    if not script.is_file():
        have = sorted(p.stem for p in BENCH_DIR.glob("*.py")) if BENCH_DIR.is_dir() else []
        raise UserError(f"mpifc bench: no benchmark {args.name!r} in {BENCH_DIR}"
                        + (f"; available: {', '.join(have)}" if have else " (benchmarks need a source checkout)"))
    saved, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args.bench_args]
    sys.path.insert(0, str(BENCH_DIR))  # as when the script runs itself: its helpers sit beside it
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved, saved_path
    return 0
