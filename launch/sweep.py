"""Rank-count sweep of FedPC training (strong and weak scaling), with an alpha-beta projection.

Usage (repo root, venv python)::

    python launch/sweep.py --ranks 2,4,8,16,32 --out results/scaling
    python launch/sweep.py --ranks 4,8 --modes weak --rows-per-client 2000 --dataset adult
    python launch/sweep.py --ranks 8,16 --assign tree --servers 2 --transport-csv bench.csv

Every job starts through mpifc's launcher: ``mpiexec`` here, ``srun`` inside a Slurm allocation
(see ``launch/slurm/``). Finished (mode, ranks, seed) cells are skipped when rerun. Same as
``mpifc experiment scaling``; this script adds the flags that only the sweep has.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mpifc.errors import UserError  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch/sweep.py", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default=None, help="rank counts, e.g. 2,4,8,16,32 or 2-5 (default 2,4,8,16,32; --quick: 2,3)")
    p.add_argument("--out", default="results/scaling", help="result folder")
    p.add_argument("--modes", default="strong,weak", help="strong, weak or both")
    p.add_argument("--dataset", default=None, help="data_prep dataset (default: adult if present, else breast-cancer)")
    p.add_argument("--rows", type=int, default=None, help="strong scaling: total rows (default 20000)")
    p.add_argument("--rows-per-client", type=int, default=None, help="weak scaling: training rows per client")
    p.add_argument("--seeds", default="0", help="seeds, e.g. 0 or 0-2")
    p.add_argument("--assign", default="flat", choices=("flat", "tree"), help="ψ strategy of the trained models")
    p.add_argument("--servers", type=int, default=None,
                   help="intermediate servers for --assign tree (and the projection)")
    p.add_argument("--transport-csv", default=None, help="CSV of launch/bench/transport.py to fit alpha-beta from")
    p.add_argument("--shards", default=None, help="shard cache folder (default OUT/shards)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before one job is killed")
    p.add_argument("--quick", action="store_true", help="tiny version (ranks 2,3 unless given)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mpifc.experiments.options import parse_int_list
    from mpifc.experiments.scaling import run

    try:
        ranks = parse_int_list(args.ranks or ("2,3" if args.quick else "2,4,8,16,32"), "--ranks")
        if min(ranks) < 2:
            raise UserError(f"--ranks {args.ranks!r}: every rank count must be >= 2")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        summary = run(args.out, parse_int_list(args.seeds, "--seeds"), quick=args.quick,
                      datasets=[args.dataset] if args.dataset else None, ranks=ranks, max_rows=args.rows,
                      shards=args.shards, timeout=args.timeout, progress=not args.no_progress, modes=modes,
                      rows_per_client=args.rows_per_client, assign=args.assign, servers=args.servers,
                      transport_csv=args.transport_csv)
    except UserError as e:
        print(f"launch/sweep.py: {e}", file=sys.stderr)
        return 2
    for f in summary["files"]:
        print(f"wrote {f}")
    print(summary["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
