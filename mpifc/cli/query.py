"""``mpifc query``: questions about a user's own rows, in the user's units and labels.

    mpifc query MODEL --data ROWS.csv|ROWS.h5 --what ll|predict|mpe|sample|marginal
                [--target COL] [--keep COL,COL] [--n-samples N] [--seed S] --out ANSWERS.csv
                [--clip] [--distributed] [--ledger FILE]

The model file carries the fitted preprocessing (:mod:`data_prep.codec`): rows come in as the
user wrote them (a CSV with a header, or an HDF5 file with one dataset per column), a column left
out or a cell left empty is marginalised, and answers go out in the same units, with category and
class labels. A value the model does not know (a label never seen in training, a fractional or
unseen value of a discrete column) is one line on stderr and exit code 2, unless ``--clip`` reads
it as the nearest known value. One process by default; under ``mpiexec -n R`` with ``--distributed`` the ranks of
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
import os
import time
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from mpifc.atomic import OutputKind
from mpifc.cli.common import (add_deadline_argument, add_device_argument, add_liveness_argument, add_output_arguments,
                              add_overwrite_argument)
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
    p.add_argument("--clip", action="store_true",
                   help="read a value the model does not know (a fractional or unseen value of a discrete column) "
                        "as the nearest one it knows, instead of refusing it; answers show the value used")
    p.add_argument("--out", required=True, metavar="ANSWERS.csv",
                   help="answer file (CSV, written atomically); may replace only an earlier answer file "
                        "(see --overwrite)")
    p.add_argument("--distributed", action="store_true",
                   help="answer with the distributed passes over the circuit's ranks (run under mpiexec)")
    p.add_argument("--ledger", default=None, metavar="FILE", help="--distributed: per-message ledger CSV")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="rows per pass")
    add_deadline_argument(p)
    add_liveness_argument(p)
    add_device_argument(p, "EiNet and RAT-SPN leaf PCs")
    add_overwrite_argument(p)
    add_output_arguments(p, "the summary")


# -- input ---------------------------------------------------------------------------------------
def read_rows(path: str) -> dict[str, list[Any]]:
    """A CSV (header line, then rows) or an HDF5 file (one 1-D dataset per column) as columns.

    Raises:
        UserError: a missing, empty, ragged or unreadable file, naming it and the line.
    """
    cols: dict[str, list[Any]] = {}
    for part, _ in iter_row_chunks(path, 1 << 62):
        for k, v in part.items():
            cols.setdefault(k, []).extend(v)
    return cols


def iter_row_chunks(path: str, chunk: int) -> Iterator[tuple[dict[str, Sequence[Any]], int]]:
    """The rows of a CSV or HDF5 file (see :func:`read_rows`) in chunks of at most ``chunk``
    rows: ``(columns, number of the chunk's first row)``, rows numbered from 1 after the header.
    At least one chunk comes, empty for a file without rows (so its columns are still checked).

    Raises:
        UserError: as :func:`read_rows`, when the chunk holding the fault is read.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: no such file")
    with p.open("rb") as f:
        head = f.read(8)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        yield from _h5_chunks(p, chunk)
    else:
        yield from _csv_chunks(p, chunk)


def _csv_chunks(path: Path, chunk: int) -> Iterator[tuple[dict[str, Sequence[Any]], int]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
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
            width = len(header)
            first, sent = 1, False
            try:
                while True:
                    rows = list(islice(reader, chunk))
                    if not rows:
                        break
                    widths = set(map(len, rows))
                    if 0 in widths:  # blank lines
                        rows = [r for r in rows if r]
                        widths.discard(0)
                    if widths - {width}:
                        _ragged(path, width)
                    if rows:
                        yield dict(zip(header, zip(*rows))), first
                        first, sent = first + len(rows), True
            except csv.Error as e:
                raise UserError(f"{path}: line {reader.line_num}: {e}") from None
            if not sent:
                yield {h: () for h in header}, first
    except UnicodeDecodeError:
        raise UserError(f"{path}: neither a CSV (UTF-8 text) nor an HDF5 file") from None


def _ragged(path: Path, width: int) -> None:
    """Raise the error of the first row of ``path`` whose number of fields is not ``width``."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            if row and len(row) != width:
                raise UserError(f"{path}: line {reader.line_num}: {len(row)} fields, the header has {width}")


def _h5_chunks(path: Path, chunk: int) -> Iterator[tuple[dict[str, Sequence[Any]], int]]:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            sets = {}
            for name, ds in f.items():
                if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
                    raise UserError(f"{path}: {name!r} is not a 1-D dataset (one dataset per column is expected)")
                sets[name] = ds
            if not sets:
                raise UserError(f"{path}: no dataset (one dataset per column is expected)")
            lengths = sorted({len(ds) for ds in sets.values()})
            if len(lengths) > 1:
                raise UserError(f"{path}: columns have different lengths {lengths}")
            n = lengths[0]
            for lo in range(0, max(n, 1), chunk):
                part = {}
                for name, ds in sets.items():
                    vals = ds[lo:lo + chunk]
                    part[name] = ([v.decode() if isinstance(v, bytes) else v for v in vals.tolist()]
                                  if vals.dtype.kind in "OS" else vals)
                yield part, lo + 1
    except OSError as e:
        raise UserError(f"{path}: not a readable HDF5 file ({e})") from None


# -- handler ---------------------------------------------------------------------------------------
CHUNK_ROWS = 20_000
"""Input rows read, encoded, answered and written per step of a one-process query."""


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
    from mpifc.atomic import Output, check_outputs
    from mpifc.federated.serialize import model_sources
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    started = time.perf_counter()
    # one process: this process's device; --distributed: each rank's, chosen in the job
    fc = load(args.model, device="cpu" if args.distributed else args.device)
    check_outputs([Output("--out", args.out, ANSWER_OUTPUT), Output("--ledger", args.ledger, LEDGER_OUTPUT)],
                  [("model", args.model), ("data", args.data)], model_sources(fc.fc), overwrite=args.overwrite)
    for k in keep:
        if k not in fc.features:
            raise UserError(f"--keep {k!r}: not a column of {args.model} ({', '.join(fc.features)})")
    target = args.target
    if args.what == "predict":
        target = fc.resolve_target(target)
        if fc.codec.labels(target) is None and int(fc.fc.n_categories.get(target, 0) or 0) < 2:
            raise UserError(f"--target {target!r} is not a discrete column of {args.model}")

    def model_rows(given: dict[str, Sequence[Any]], first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows to pass (model units), per pass row its input row number (1-based), and per
        input row the cells ``--clip`` changed."""
        x, clipped = fc.codec.encode_checked(given, source=args.data, first_row=first, clip=args.clip)
        row_no = np.arange(first, first + len(x))
        if args.what == "marginal":
            x = fc.keep_columns(x, keep, "--keep")
        elif args.what == "sample":
            x, row_no = np.repeat(x, args.n_samples, axis=0), np.repeat(row_no, args.n_samples)
        return x, row_no, clipped

    table = _AnswerTable(fc, args.what, target)
    if args.distributed:
        from mpifc.fedpc.job import query

        held: dict[str, Any] = {}

        def load_rows() -> np.ndarray:
            held["given"] = read_rows(args.data)
            held["rows"], held["row_no"], held["clipped"] = model_rows(held["given"], 1)
            return held["rows"]

        def answer(raw: np.ndarray, stage: Any) -> None:
            # Inside the job, on the querier: the answer file is staged with the ledger, so both
            # appear only if the whole job succeeds (a failed write leaves neither).
            with table.open(stage(args.out)):
                table.write(held["rows"], held["row_no"], raw, held["given"], held["clipped"])
            table.note_columns(held["given"])
            held["summary"] = table.summary()

        cfg = {"model": str(args.model), "what": args.what, "target": target, "batch": args.batch,
               "seed": args.seed, "progress": not (args.json or args.quiet)}
        code = query(cfg, load_rows, deadline=args.deadline, ledger=args.ledger, liveness=args.liveness,
                     device=args.device, write_answer=answer)
        if "summary" not in held:  # a rank other than the querier: the querier writes the answer
            return code
        summary, mode = held["summary"], "distributed"
    else:
        import mpifc.progress as progress

        with progress.ticker("mpifc query", not (args.json or args.quiet)) as tick, table.open(args.out):
            tick.phase(f"reading {args.data}")
            for given, first in iter_row_chunks(args.data, _chunk_rows(args.what, args.n_samples, args.batch)):
                rows, row_no, clipped = model_rows(given, first)
                tick.phase(f"answering rows {first}-{first + len(clipped) - 1} ({args.what})")
                first_batch = (first - 1) * args.n_samples // args.batch
                table.write(rows, row_no, _answer_one_process(fc, rows, args.what, target, args.seed, args.batch,
                                                              first_batch), given, clipped)
                table.note_columns(given)
        summary, mode = table.summary(), "one process"
    seconds = time.perf_counter() - started
    if args.clip:
        summary["clipped_cells"] = table.clipped
    ignored = [c for c in table.columns if c in fc.codec.skipped]
    if ignored:
        summary["skipped_columns"] = ignored
    summary.update({"what": args.what, "out": str(args.out), "mode": mode, "model": str(args.model),
                    "data": str(args.data), "seconds": round(seconds, 3),
                    "rows_per_second": round(summary["rows"] / seconds, 1) if seconds > 0 else None})
    if args.json:
        print(json.dumps(summary, allow_nan=False), flush=True)
    elif not args.quiet:
        print(_human(summary), flush=True)
    return 0


def _chunk_rows(what: str, n_samples: int, batch: int) -> int:
    """Input rows per step: about :data:`CHUNK_ROWS`; for ``sample``, a whole number of
    ``--batch`` passes (its draws depend on the pass a row falls in)."""
    if what != "sample":
        return CHUNK_ROWS
    per = batch // math.gcd(batch, n_samples)  # input rows filling a whole number of passes
    return per * max(1, CHUNK_ROWS // per)


def _answer_one_process(fc: Any, rows: np.ndarray, what: str, target: str | None, seed: int, batch: int,
                        first_batch: int = 0) -> np.ndarray:
    from mpifc.federated.mpe import mpe_reference, sample_conditional_seeded

    if what in ("ll", "marginal"):
        return fc.root_values(rows)[:, 0]
    if what == "predict":
        return fc.class_log_joint(rows, target)
    cols = {f: rows[:, j] for j, f in enumerate(fc.features)}
    if what == "mpe":
        return mpe_reference(fc.fc, cols)
    return sample_conditional_seeded(fc.fc, cols, seed, batch, first_batch)


class _AnswerTable:
    """The answer file, written a chunk of rows at a time into a temp file that replaces
    ``--out`` once complete, and the summary's tallies over every chunk."""

    def __init__(self, fc: Any, what: str, target: str | None) -> None:
        self.fc, self.what, self.target = fc, what, target
        self.rows = self.answers = self.completed = self.labelled = self.correct = self.finite = self.clipped = 0
        self.ll_sum = 0.0
        self.columns: list[str] = []  # the input's columns, in the order first seen
        self._writer: Any = None
        if what in ("ll", "marginal"):
            self.header = ["row", "log_likelihood"]
        elif what == "predict":
            self.labels = fc.codec.labels(target) or [str(c) for c in range(int(fc.fc.n_categories[target]))]
            self.header = ["row", target] + [f"p_{lab}" for lab in self.labels]
        else:
            self.header = ["row"] + (["sample"] if what == "sample" else []) + list(fc.features)

    @contextmanager
    def open(self, path: str | Path) -> Iterator[None]:
        """Write the answers of every :meth:`write` inside into ``path``, atomically: a failed
        write (a full disk, ...) is one :class:`UserError` naming ``path`` and leaves nothing."""
        from mpifc.atomic import atomic_path, write_all

        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            buf = io.StringIO()
            self._writer = csv.writer(buf, lineterminator="\n")

            def flush() -> None:
                write_all(f, buf.getvalue().encode("utf-8"), path)
                buf.seek(0)
                buf.truncate()

            self._flush = flush
            try:
                self._writer.writerow(self.header)
                yield
                flush()
                f.flush()
                os.fsync(f.fileno())
            finally:
                self._writer = None

    def note_columns(self, given: dict[str, Sequence[Any]]) -> None:
        self.columns += [c for c in given if c not in self.columns]

    def write(self, rows: np.ndarray, row_no: np.ndarray, raw: np.ndarray, given: dict[str, Sequence[Any]],
              changed: np.ndarray) -> None:
        """Append the answers of one chunk: model rows, their input row numbers, the raw answer,
        the cells as the user gave them and, per input row, the cells ``--clip`` changed. A
        completed row keeps the user's own text in every cell the user filled in, unless
        ``--clip`` changed it: then it shows the value the model used."""
        self.clipped += int(changed.sum())
        numbers = row_no.tolist()
        self.rows += len(np.unique(row_no))
        self.answers += len(numbers)
        first = numbers[0] if numbers else 1
        if self.what in ("ll", "marginal"):
            ok = np.isfinite(raw)
            self.ll_sum += float(raw[ok].sum())
            self.finite += int(ok.sum())
            self._writer.writerows(zip(numbers, _cells(raw)))
        elif self.what == "predict":
            from mpifc.api import proba_from_joint

            proba = proba_from_joint(raw)
            best = np.argmax(proba, axis=1)
            pred = [self.labels[c] for c in best.tolist()]
            truth = rows[:, self.fc.features.index(self.target)]  # the target as given (model codes)
            known = ~np.isnan(truth)
            self.labelled += int(known.sum())
            self.correct += int((best[known] == truth[known]).sum())
            self._writer.writerows(zip(numbers, pred, *[_cells(proba[:, c]) for c in range(proba.shape[1])]))
        else:
            dec = self.fc.decode(raw)
            seen = 0
            lines = []
            observed = ~np.isnan(rows)
            for i, r in enumerate(numbers):
                lead = [r]
                if self.what == "sample":
                    seen = seen + 1 if i and numbers[i - 1] == r else 1
                    lead.append(seen)
                cells = []
                for j, f in enumerate(self.fc.features):
                    as_given = observed[i, j] and f in given and not changed[r - first, j]
                    cells.append(str(given[f][r - first]).strip() if as_given else _cell(dec[f][i]))
                lines.append(lead + cells)
            self.completed += int((~observed).sum())
            self._writer.writerows(lines)
        self._flush()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "answers": self.answers}
        if self.what in ("ll", "marginal"):
            out["mean_log_likelihood_nats"] = self.ll_sum / self.finite if self.finite else None
        elif self.what == "predict":
            if self.labelled:
                out["accuracy"] = self.correct / self.labelled
                out["rows_with_label"] = self.labelled
        else:
            out["completed_cells"] = self.completed
        return out


def _cells(values: np.ndarray) -> list[Any]:
    """Floats as the csv module writes them (``repr``: full precision, reads back to the same
    float64); a NaN as an empty cell."""
    out = values.tolist()
    if np.isnan(values).any():
        out = [_num(v) for v in out]
    return out


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


def is_answer_file(path: str | Path) -> bool:
    """Whether ``path`` is an earlier answer file of ``mpifc query``, judged by its content: a
    UTF-8 CSV whose header starts with ``row`` and whose lines start with row numbers (1, 2, ...,
    in order; repeated for ``sample``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16).decode("utf-8")
        lines = list(csv.reader(io.StringIO(head)))[:200]
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    if not lines or len(lines[0]) < 2 or lines[0][0] != "row":
        return False
    last = 1
    for line in lines[1:-1]:  # the last line read may be cut off
        if not line or not line[0].isdigit() or not last <= int(line[0]) <= last + 1:
            return False
        last = int(line[0])
    return True


ANSWER_OUTPUT = OutputKind("an answer file of mpifc query", is_answer_file)
"""``query --out``: may replace only an earlier answer file."""


def _human(s: dict[str, Any]) -> str:
    first = f"query {s['what']}: {s['rows']} rows of {s['data']} ({s['mode']}) -> {s['answers']} answers in {s['out']}"
    more = [f"{s['seconds']:.2f} s" + (f", {s['rows_per_second']:,.0f} rows/s" if s.get("rows_per_second") else "")]
    if s.get("mean_log_likelihood_nats") is not None:
        more.append(f"mean log-likelihood {s['mean_log_likelihood_nats']:.4f} nats per row")
    if "accuracy" in s:
        more.append(f"accuracy {s['accuracy']:.4f} on the {s['rows_with_label']} rows that give the label")
    if "completed_cells" in s:
        more.append(f"{s['completed_cells']} cells filled in")
    if s.get("skipped_columns"):
        more.append(f"left out {', '.join(s['skipped_columns'])} (skipped when the shards were prepared)")
    if s.get("clipped_cells"):
        more.append(f"{s['clipped_cells']} cells read as the nearest value the model knows (--clip)")
    return first + "\n  " + "; ".join(more)
