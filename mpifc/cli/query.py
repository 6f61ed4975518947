"""``mpifc query``: questions about a user's own rows, in the user's units and labels.

    mpifc query MODEL --data ROWS.csv|ROWS.h5 --what ll|predict|mpe|sample|marginal
                [--target COL] [--keep COL,COL] [--n-samples N] [--seed S] --out ANSWERS.csv
                [--distributed] [--ledger FILE]

The model file carries the fitted preprocessing (:mod:`data_prep.codec`): rows come in as the
user wrote them (a CSV with a header, or an HDF5 file with one dataset per column), a column left
out or a cell left empty is marginalised, and answers go out in the same units, with category and
class labels. One process by default; under ``mpiexec -n R`` with ``--distributed`` the ranks of
the circuit answer with the distributed passes and every byte lands in ``--ledger``.

Answer files (CSV, written atomically), one line per input row (``sample``: per sample):

* ``ll``: ``row,log_likelihood`` (nats; the density of real columns in their standardised units);
* ``marginal``: the same for the ``--keep`` columns alone;
* ``predict``: ``row,<target>,p_<label>...``: the most probable label and one probability per class;
* ``mpe``: ``row`` and every column, each missing cell completed by the most probable value;
* ``sample``: ``row,sample`` and every column, the missing cells drawn from the conditional.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from mpifc.cli.common import add_deadline_argument, add_liveness_argument, add_output_arguments
from mpifc.errors import UserError

QUESTIONS = ("ll", "predict", "mpe", "sample", "marginal")
DEFAULT_BATCH = 10_000


def add_query_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``mpifc query``."""
    p.add_argument("model", help="model file written by mpifc train (it carries the preprocessing)")
    p.add_argument("--data", required=True, metavar="ROWS",
                   help="rows to ask about: a CSV with a header line, or an HDF5 file with one dataset per column; "
                        "values in the original units and labels; empty cells and absent columns are marginalised")
    p.add_argument("--what", required=True, choices=QUESTIONS,
                   help="ll: log-likelihood per row; predict: label and class probabilities; mpe: most probable "
                        "completion; sample: completions drawn from the model; marginal: log-likelihood of --keep")
    p.add_argument("--target", default=None, metavar="COL",
                   help="predict: the column to predict (default: the dataset's target)")
    p.add_argument("--keep", default=None, metavar="COL,COL",
                   help="marginal: the columns whose joint log-likelihood is asked; all others are marginalised")
    p.add_argument("--n-samples", type=int, default=1, metavar="N", help="sample: completions per input row")
    p.add_argument("--seed", type=int, default=0, help="sample: random seed (same seed, same samples)")
    p.add_argument("--out", required=True, metavar="ANSWERS.csv", help="answer file (CSV, written atomically)")
    p.add_argument("--distributed", action="store_true",
                   help="answer with the distributed passes over the circuit's ranks (run under mpiexec)")
    p.add_argument("--ledger", default=None, metavar="FILE", help="--distributed: per-message ledger CSV")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows per pass")
    add_deadline_argument(p)
    add_liveness_argument(p)
    add_output_arguments(p, "the summary")


# -- input ---------------------------------------------------------------------------------------
def read_rows(path: str) -> dict[str, list[Any]]:
    """A CSV (header line, then rows) or an HDF5 file (one 1-D dataset per column) as columns.

    Raises:
        UserError: a missing, empty, ragged or unreadable file, naming it and the line.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: no such file")
    with p.open("rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return _read_h5(p)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: neither a CSV (UTF-8 text) nor an HDF5 file") from None
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise UserError(f"{path}: empty file (a header line naming the columns is needed)") from None
    except csv.Error as e:
        raise UserError(f"{path}: line 1: {e}") from None
    header = [h.strip() for h in header]
    if not any(header):
        raise UserError(f"{path}: line 1: the header names no column")
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise UserError(f"{path}: line 1: column {dup[0]!r} appears twice")
    cols: dict[str, list[Any]] = {h: [] for h in header}
    try:
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise UserError(f"{path}: line {line_no}: {len(row)} fields, the header has {len(header)}")
            for h, v in zip(header, row):
                cols[h].append(v)
    except csv.Error as e:
        raise UserError(f"{path}: {e}") from None
    return cols


def _read_h5(path: Path) -> dict[str, list[Any]]:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            cols: dict[str, list[Any]] = {}
            for name, ds in f.items():
                if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
                    raise UserError(f"{path}: {name!r} is not a 1-D dataset (one dataset per column is expected)")
                vals = ds[()]
                cols[name] = [v.decode() if isinstance(v, bytes) else v for v in vals.tolist()]
    except OSError as e:
        raise UserError(f"{path}: not a readable HDF5 file ({e})") from None
    if not cols:
        raise UserError(f"{path}: no dataset (one dataset per column is expected)")
    return cols


# -- handler ---------------------------------------------------------------------------------------
def query_main(args: argparse.Namespace) -> int:
    """Handler of ``mpifc query``."""
    from mpifc.api import load

    if args.n_samples < 1:
        raise UserError(f"--n-samples must be >= 1, got {args.n_samples}")
    if args.batch < 1:
        raise UserError(f"--batch must be >= 1, got {args.batch}")
    if args.ledger and not args.distributed:
        raise UserError("--ledger needs --distributed (one process sends no message)")
    keep = [k.strip() for k in (args.keep or "").split(",") if k.strip()]
    if args.what == "marginal" and not keep:
        raise UserError("--what marginal needs --keep COL,COL")
    from mpifc.atomic import check_outputs

    check_outputs([("--out", args.out, False), ("--ledger", args.ledger, False)],
                  [("model", args.model), ("data", args.data)])
    fc = load(args.model)
    for k in keep:
        if k not in fc.features:
            raise UserError(f"--keep {k!r}: not a column of {args.model} ({', '.join(fc.features)})")
    target = args.target
    if args.what == "predict":
        target = fc.resolve_target(target)
        if fc.codec.labels(target) is None and int(fc.fc.n_categories.get(target, 0) or 0) < 2:
            raise UserError(f"--target {target!r} is not a discrete column of {args.model}")

    given: dict[str, list[Any]] = {}

    def model_rows() -> tuple[np.ndarray, np.ndarray]:
        """The rows to pass (model units) and, per pass row, its input row number (1-based)."""
        given.update(read_rows(args.data))
        x = fc.encode(given, source=args.data)
        row_no = np.arange(1, len(x) + 1)
        if args.what == "marginal":
            masked = np.full_like(x, np.nan)
            idx = [fc.features.index(k) for k in keep]
            masked[:, idx] = x[:, idx]
            x = masked
        elif args.what == "sample":
            x, row_no = np.repeat(x, args.n_samples, axis=0), np.repeat(row_no, args.n_samples)
        return x, row_no

    if args.distributed:
        from mpifc.fedpc.job import query

        held: dict[str, Any] = {}

        def load_rows() -> np.ndarray:
            held["rows"], held["row_no"] = model_rows()
            return held["rows"]

        cfg = {"model": str(args.model), "what": args.what, "target": target, "batch": args.batch,
               "seed": args.seed}
        code = query(cfg, load_rows, deadline=args.deadline, ledger=args.ledger, liveness=args.liveness)
        if "rows" not in held:  # a rank other than the querier: the querier writes the answer
            return code
        rows, row_no, raw = held["rows"], held["row_no"], cfg["_answer"]
        mode = "distributed"
    else:
        rows, row_no = model_rows()
        raw = _answer_one_process(fc, rows, args.what, target, args.seed, args.batch)
        mode = "one process"
    header, lines, summary = _answer_table(fc, args.what, target, rows, row_no, raw, given)
    from mpifc.runtime.outputs import after_job

    with after_job(args.out):  # removed again if the job still fails before this rank ends
        _write_csv(args.out, header, lines)
    summary.update({"what": args.what, "rows": int(len(np.unique(row_no))), "answers": len(lines),
                    "out": str(args.out), "mode": mode, "model": str(args.model), "data": str(args.data)})
    if args.json:
        print(json.dumps(summary, allow_nan=False), flush=True)
    elif not args.quiet:
        print(_human(summary), flush=True)
    return 0


def _answer_one_process(fc: Any, rows: np.ndarray, what: str, target: str | None, seed: int, batch: int) -> np.ndarray:
    from mpifc.federated.evaluate import class_log_joint, log_likelihood
    from mpifc.federated.mpe import mpe_reference, sample_conditional_seeded

    cols = {f: rows[:, j] for j, f in enumerate(fc.features)}
    if what in ("ll", "marginal"):
        return np.asarray(log_likelihood(fc.fc, rows), dtype=np.float64)
    if what == "predict":
        blanked = rows.copy()
        blanked[:, fc.features.index(target)] = np.nan
        return class_log_joint(fc.fc, blanked, target)
    if what == "mpe":
        return mpe_reference(fc.fc, cols)
    return sample_conditional_seeded(fc.fc, cols, seed, batch)


def _answer_table(fc: Any, what: str, target: str | None, rows: np.ndarray, row_no: np.ndarray,
                  raw: np.ndarray, given: dict[str, list[Any]]) -> tuple[list[str], list[list[Any]], dict[str, Any]]:
    """Header, lines (user units) and the summary figures of an answer. A completed row keeps
    the user's own text in every cell the user filled in."""
    summary: dict[str, Any] = {}
    if what in ("ll", "marginal"):
        lines = [[int(r), _num(v)] for r, v in zip(row_no, raw)]
        finite = raw[np.isfinite(raw)]
        summary["mean_log_likelihood_nats"] = float(finite.mean()) if finite.size else None
        return ["row", "log_likelihood"], lines, summary
    if what == "predict":
        from scipy.special import logsumexp

        proba = np.exp(raw - logsumexp(raw, axis=1, keepdims=True))
        labels = fc.codec.labels(target) or [str(c) for c in range(raw.shape[1])]
        pred = [labels[c] for c in np.argmax(proba, axis=1)]
        header = ["row", target] + [f"p_{lab}" for lab in labels]
        lines = [[int(r), p, *[_num(v) for v in pr]] for r, p, pr in zip(row_no, pred, proba)]
        truth = rows[:, fc.features.index(target)]  # the target as given in the input (model codes)
        known = ~np.isnan(truth)
        if known.any():
            summary["accuracy"] = float((np.argmax(proba, axis=1)[known] == truth[known]).mean())
            summary["rows_with_label"] = int(known.sum())
        return header, lines, summary
    dec = fc.decode(raw)
    header = ["row"] + (["sample"] if what == "sample" else []) + list(fc.features)
    lines = []
    seen: dict[int, int] = {}
    for i, r in enumerate(row_no):
        lead = [int(r)]
        if what == "sample":
            seen[int(r)] = seen.get(int(r), 0) + 1
            lead.append(seen[int(r)])
        cells = []
        for j, f in enumerate(fc.features):
            observed = not np.isnan(rows[i, j])
            cells.append(str(given[f][int(r) - 1]).strip() if observed and f in given else _cell(dec[f][i]))
        lines.append(lead + cells)
    summary["completed_cells"] = int(np.isnan(rows).sum())
    return header, lines, summary


def _num(v: float) -> str:
    """Full precision, so an answer file reads back to the same float64."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(float(v))


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return ""
        return str(int(f)) if f.is_integer() and abs(f) < 1e15 else repr(f)
    return str(v)


def _write_csv(path: str, header: list[str], lines: list[list[Any]]) -> None:
    from mpifc.atomic import atomic_write_text

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(lines)
    try:
        atomic_write_text(path, buf.getvalue())
    except OSError as e:
        raise UserError(f"--out {path}: cannot write ({e.strerror or e})") from None


def _human(s: dict[str, Any]) -> str:
    first = f"query {s['what']}: {s['rows']} rows of {s['data']} ({s['mode']}) -> {s['answers']} answers in {s['out']}"
    more = []
    if s.get("mean_log_likelihood_nats") is not None:
        more.append(f"mean log-likelihood {s['mean_log_likelihood_nats']:.4f} nats per row")
    if "accuracy" in s:
        more.append(f"accuracy {s['accuracy']:.4f} on the {s['rows_with_label']} rows that give the label")
    if "completed_cells" in s:
        more.append(f"{s['completed_cells']} cells filled in")
    return first + ("\n  " + "; ".join(more) if more else "")
