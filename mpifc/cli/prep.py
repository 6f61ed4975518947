"""``python -m data_prep``: a dataset into per-client HDF5 shards (see :mod:`data_prep.shards`)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpifc.errors import UserError

from data_prep.datasets import DATASETS
from data_prep.files import default_data_root
from data_prep.partition import SETTINGS, SPLITS
from data_prep.prepare import VALID_MODES, PrepConfig, prepare
from data_prep.preprocess import ENCODINGS
from data_prep.transforms import MAX_LEVELS, SCALES
from data_prep.shards import check_out_folder, write_shards


def _label_owner(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a client index or 'all', not {text!r}")


def _patches(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    try:
        return int(rows), int(cols)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 2x2, not {text!r}")


def build_parser() -> argparse.ArgumentParser:
    from mpifc.cli import HelpFormatter

    p = argparse.ArgumentParser(
        prog="python -m data_prep", formatter_class=HelpFormatter,
        usage="python -m data_prep --out DIR [--dataset NAME] [--setting S] [--clients N] [options]\n"
              "       python -m data_prep --list",
        description="Turn a dataset into one HDF5 shard per client, a held-out test set and "
                    "a manifest (format mpifc-shards/1).")
    p.add_argument("--list", action="store_true", help="list the datasets and exit")
    p.add_argument("--dataset", default="breast-cancer", metavar="NAME",
                   help="dataset name (debd:SET for a DEBD set, csv with --path for your own table)")
    p.add_argument("--path", metavar="P",
                   help="the dataset's file or folder (default: under the data root)")
    p.add_argument("--data-root", metavar="DIR",
                   help="data root (default: $MPIFC_DATA, else <repo>/../shared/data)")
    p.add_argument("--setting", choices=SETTINGS, default="horizontal",
                   help="how data is split among clients (default horizontal); central: one client "
                        "with every row and feature, on which mpifc train runs Algorithm 1 (by default "
                        "one LearnSPN; with --clusters K, K k-means clusters of the rows, one PC each)")
    p.add_argument("--clients", type=int, default=2, metavar="N",
                   help="number of clients (default 2)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="same seed, same shards (default 0)")
    p.add_argument("--split", choices=SPLITS, default="iid",
                   help="how samples are split in horizontal and hybrid settings")
    p.add_argument("--alpha", type=float, default=0.5, metavar="A",
                   help="Dirichlet concentration (default 0.5)")
    p.add_argument("--label-owner", type=_label_owner, default=None, metavar="K|all",
                   help="client holding the target, or 'all' (vertical default 0, else all)")
    p.add_argument("--encode", choices=ENCODINGS, default="target",
                   help="categoricals: target encoding orders their levels (with --max-levels 0: "
                        "target-encoded floats), or integer codes (none)")
    p.add_argument("--no-impute", dest="impute", action="store_false",
                   help="keep missing values as NaN instead of imputing the train median")
    p.add_argument("--standardize", action=argparse.BooleanOptionalAction, default=None,
                   help="scale numeric features (default: on for tables, off for "
                        "images and binary sets)")
    p.add_argument("--scale", choices=SCALES, default=None,
                   help="tables: how a real column is scaled: standardize, normal-score (robust to "
                        "heavy tails), or auto, chosen per column on validation rows carved from the "
                        "training rows (default: auto for tables, standardize for images)")
    p.add_argument("--max-levels", type=int, default=None, metavar="K",
                   help=f"tables: a numeric column with at most K distinct training values is stored "
                        f"as level codes and modelled as discrete (default {MAX_LEVELS} for tables, 0 = "
                        f"off, as for images)")
    p.add_argument("--test-fraction", type=float, default=None, metavar="F",
                   help="hold out this stratified fraction (default: the dataset's own test "
                        "split, else 0.2)")
    p.add_argument("--valid", choices=VALID_MODES, default="keep",
                   help="a dataset's own validation split (debd's NAME.valid): keep it as each client's "
                        "valid/ rows, held out of training (default), or merge it into the training rows")
    p.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help="stratified deterministic subsample of the dataset first")
    p.add_argument("--shared-features", type=int, default=None, metavar="K",
                   help="hybrid tables: features shared by all clients (default d/4)")
    p.add_argument("--patches", type=_patches, default=None, metavar="RxC",
                   help="images: patch grid ROWSxCOLS (must give --clients patches)")
    p.add_argument("--overlap", type=int, default=2, metavar="PX",
                   help="hybrid images: pixels shared by neighbouring patches (default 2)")
    p.add_argument("--segment", action="append", default=[], metavar="PREDICATE",
                   help="--split segment: one per client, e.g. 'education in Bachelors,Masters'")
    p.add_argument("--oversample", type=float, default=4.0, metavar="W",
                   help="--split segment: weight of a matching row for its client (default 4)")
    p.add_argument("--out", metavar="DIR",
                   help="required (unless --list): output directory; an earlier shard set there is replaced "
                        "atomically, a folder holding anything else is refused (unless --overwrite), and a "
                        "folder holding the data's own files is never replaced")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out even when it holds files that are not a shard set (the whole folder "
                        "goes); never a folder that holds a file the data is read from")
    return p


def list_datasets(out=None) -> None:
    """Print the registry: name, what it is, where it is looked for and where to get it."""
    out = sys.stdout if out is None else out
    root = default_data_root()
    for info in DATASETS.values():
        where = "embedded" if info.folder is None and info.name != "csv" else (
            "--path FILE" if info.folder is None else str(root / info.folder))
        found = "" if info.folder is None else (
            "  [found]" if (root / info.folder).exists() else "  [missing]")
        print(f"{info.name:14s} {info.summary}\n{'':14s} location: {where}{found}; "
              f"source: {info.source}", file=out)


def _given_sources(path: str | None) -> list[Path]:
    """``--path`` and, for a file, the schema beside it (``data.csv`` -> ``data.schema.json``)."""
    if not path:
        return []
    p = Path(path)
    return [p, p.with_name(p.stem + ".schema.json")] if p.is_file() else [p]


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run; UserError propagates to :func:`main`."""
    args = build_parser().parse_args(argv)
    if args.list:
        list_datasets()
        return 0
    if not args.out:
        raise UserError("--out DIR is required (or use --list)")
    # Refused before any work where the flags tell already (write_shards checks again, with
    # every file the data was read from).
    check_out_folder(Path(args.out).resolve(), _given_sources(args.path), args.overwrite)
    config = PrepConfig(dataset=args.dataset, path=args.path, data_root=args.data_root,
                        setting=args.setting, clients=args.clients, seed=args.seed,
                        split=args.split, alpha=args.alpha, label_owner=args.label_owner,
                        encode=args.encode, impute=args.impute, standardize=args.standardize,
                        scale=args.scale, max_levels=args.max_levels,
                        test_fraction=args.test_fraction, max_rows=args.max_rows,
                        shared_features=args.shared_features, patches=args.patches,
                        overlap=args.overlap, segments=tuple(args.segment),
                        oversample=args.oversample, valid=args.valid)
    prepared = prepare(**{f: getattr(config, f) for f in config.__dataclass_fields__})
    manifest = write_shards(prepared, Path(args.out), overwrite=args.overwrite)
    for c in manifest.clients:
        valid = f", {c['n_valid']} validation rows" if c.get("n_valid") else ""
        print(f"client {c['index']}: {c['n_train']} train rows, {c['n_test']} test rows{valid}, "
              f"{len(c['features'])} features")
    print(f"wrote {manifest.n_clients} shards and {manifest.test['file']} "
          f"({manifest.test['n']} rows) to {manifest.directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (2 with a one-line message on bad input)."""
    try:
        return run(argv)
    except UserError as exc:
        message = " ".join(str(exc).split())
        print(f"data_prep: error: {message}", file=sys.stderr)
        return exc.exit_code
