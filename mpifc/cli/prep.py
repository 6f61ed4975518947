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
from data_prep.transforms import MAX_LEVELS, SCALES
from data_prep.shards import check_out_folder, write_shards


CATEGORICALS = ("auto", "target", "codes")
"""``--categoricals`` choices; ``codes`` is :class:`~data_prep.prepare.PrepConfig`'s ``encode="none"``."""


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
              "       python -m data_prep --dataset csv --path FILE.csv --target COLUMN --out DIR [options]\n"
              "       python -m data_prep --list",
        description="Turn a dataset into one HDF5 shard per client, a held-out test set and "
                    "a manifest (format mpifc-shards/1).")
    p.add_argument("--list", action="store_true", help="list the datasets and exit")
    p.add_argument("--dataset", default="breast-cancer", metavar="NAME",
                   help="dataset name (debd:SET for a DEBD set, csv with --path for your own table)")
    p.add_argument("--path", metavar="P",
                   help="the dataset's file or folder (default: under the data root)")
    p.add_argument("--target", metavar="COLUMN",
                   help="csv: the column to predict (2 to 1,000 classes); without it the table has no target")
    p.add_argument("--schema", metavar="FILE",
                   help="csv: the column types as a JSON schema (docs/formats.md); without it FILE.schema.json "
                        "beside the CSV is read, else the types are inferred from the CSV, printed, and written "
                        "to DIR/schema.json to edit and pass back here")
    p.add_argument("--data-root", metavar="DIR",
                   help="data root (default: $MPIFC_DATA, else <repo>/../shared/data)")
    p.add_argument("--setting", choices=SETTINGS, default="horizontal",
                   help="how data is split among clients; central: one client "
                        "with every row and feature, on which mpifc train runs Algorithm 1 (by default "
                        "one LearnSPN; with --clusters K, K k-means clusters of the rows, one PC each)")
    p.add_argument("--clients", type=int, default=None, metavar="N",
                   help="number of clients (default: 1 for --setting central, else 2)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="same seed, same shards")
    p.add_argument("--split", choices=SPLITS, default="iid",
                   help="how samples are split in horizontal and hybrid settings")
    p.add_argument("--alpha", type=float, default=0.5, metavar="A",
                   help="Dirichlet concentration")
    p.add_argument("--label-owner", type=_label_owner, default=None, metavar="K|all",
                   help="client holding the target, or 'all' (vertical default 0, else all)")
    p.add_argument("--categoricals", choices=CATEGORICALS, default="auto",
                   help="how categorical columns are stored: target = levels ordered by their target encoding "
                        "(binary targets only; with --max-levels 0 the target-encoded floats), codes = one "
                        "integer code per label, modelled as categorical; auto = target for a binary target, "
                        "codes for any other target or none (fits every table; the choice is printed)")
    p.add_argument("--impute", action=argparse.BooleanOptionalAction, default=True,
                   help="fill missing values in the shards with the training median (the most frequent code for "
                        "categoricals); --no-impute keeps them as NaN")
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
                        "valid/ rows, held out of training, or merge it into the training rows")
    p.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help="stratified deterministic subsample of the dataset first")
    p.add_argument("--shared-features", type=int, default=None, metavar="K",
                   help="hybrid tables: features shared by all clients (default d/4)")
    p.add_argument("--patches", type=_patches, default=None, metavar="RxC",
                   help="images: patch grid ROWSxCOLS (must give --clients patches)")
    p.add_argument("--overlap", type=int, default=2, metavar="PX",
                   help="hybrid images: pixels shared by neighbouring patches")
    p.add_argument("--segment", action="append", default=[], metavar="PREDICATE",
                   help="--split segment: one per client, e.g. 'education in Bachelors,Masters'")
    p.add_argument("--oversample", type=float, default=4.0, metavar="W",
                   help="--split segment: weight of a matching row for its client")
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
    import mpifc.progress as progress

    args = build_parser().parse_args(argv)
    if args.list:
        list_datasets()
        return 0
    with progress.ticker("data_prep"):
        return _prepare(args)


def _prepare(args: argparse.Namespace) -> int:
    """Prepare and write the shards the flags ask for, and say what was done."""
    if not args.out:
        raise UserError("--out DIR is required (or use --list)")
    # Refused before any work where the flags tell already (write_shards checks again, with
    # every file the data was read from).
    check_out_folder(Path(args.out).resolve(), _given_sources(args.path), args.overwrite)
    config = PrepConfig(dataset=args.dataset, path=args.path, data_root=args.data_root,
                        target=args.target, schema=args.schema,
                        setting=args.setting, seed=args.seed,
                        clients=args.clients if args.clients is not None else 1 if args.setting == "central" else 2,
                        split=args.split, alpha=args.alpha, label_owner=args.label_owner,
                        encode="none" if args.categoricals == "codes" else args.categoricals,
                        impute=args.impute, standardize=args.standardize,
                        scale=args.scale, max_levels=args.max_levels,
                        test_fraction=args.test_fraction, max_rows=args.max_rows,
                        shared_features=args.shared_features, patches=args.patches,
                        overlap=args.overlap, segments=tuple(args.segment),
                        oversample=args.oversample, valid=args.valid)
    prepared = prepare(**{f: getattr(config, f) for f in config.__dataclass_fields__})
    manifest = write_shards(prepared, Path(args.out), overwrite=args.overwrite)
    _print_schema(prepared, manifest)
    for c in manifest.clients:
        valid = f", {c['n_valid']} validation rows" if c.get("n_valid") else ""
        print(f"client {c['index']}: {c['n_train']} train rows, {c['n_test']} test rows{valid}, "
              f"{len(c['features'])} features")
    print(f"wrote {manifest.n_clients} shards and {manifest.test['file']} "
          f"({manifest.test['n']} rows) to {manifest.directory}")
    return 0


def _print_schema(prepared, manifest) -> None:
    """A user's table: the schema it was read with (inferred: as a table, with the reasons) and
    how its categoricals are stored."""
    from data_prep.infer import schema_table

    info = prepared.table.schema_info
    if info is None:
        return
    written = Path(manifest.directory) / manifest.raw["schema"]
    if info["guesses"] is not None:
        print(f"column types inferred from {prepared.config.path} ({prepared.table.n_rows} rows):")
        print(schema_table(info["guesses"]))
        print(f"schema written to {written}; edit it and pass it back with --schema FILE")
    else:
        print(f"schema: {info['source']} (copied to {written})")
    cats = [f for f, m in zip(prepared.table.features, prepared.table.meta_types) if m == "categorical"]
    if cats:
        k = len(prepared.table.classes or [])
        how = ("levels ordered by their target encoding" if prepared.preprocessor.encode == "target"
               else "one code per label")
        why = f"the target has {k} classes" if k else "no target"
        print(f"categorical columns ({len(cats)}): {how} ({why})")


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (2 with a one-line message on bad input)."""
    try:
        return run(argv)
    except UserError as exc:
        message = " ".join(str(exc).split())
        print(f"data_prep: error: {message}", file=sys.stderr)
        return exc.exit_code
