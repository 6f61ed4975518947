"""Table 1: test log-likelihood and relative runtime, centralized LearnSPN against FedPC.

Cells per (dataset, seed): ``central/learnspn`` (LearnSPN on the one-client shards, timed in
this process) and ``fedpc`` in each setting (horizontal 5 clients, vertical 2, hybrid 2; the
horizontal split as appendix E states it, see :func:`horizontal_split`; Table 4's
hyperparameters as stated, MSPN (piecewise) leaves and SPFlow's RDC convention, see
:func:`paper_hp` and :data:`mpifc.experiments.paper.SPFLOW_RDC`), trained as an MPI job and
evaluated gathered. All rows by default, as the paper. The ``central`` cell (LL
cent.) gets the horizontal cell's settings. The relative runtime of a FedPC cell is its
critical-path training CPU seconds over the CPU seconds of a centralized LearnSPN with the
cell's own settings (Table 4 differs per setting) on all training rows of the same seed, run in
this process right after the job (:func:`central_reference`), both after the same warm-up
(:func:`mpifc.fedpc.train.warm_up`). Both runs use the same seed, so the same train/test rows.
Timing rounds (``timing_repeats``, default :data:`TIMING_REPEATS`): the job and the centralized fit
run alternately that many times and each side's figure is its least CPU seconds (the model is
the same every round; on a shared machine noise only ever adds time), as ``launch/bench/fedpc.py``
measures; every round is kept in the cell.

MNIST runs with EiNet leaves, as the paper did (section 4 and Table 5: Gaussian leaves on
standardized pixels, variance clamped to [1e-3, 0.25]; standardized as torchvision's MNIST
normalisation, see :func:`mnist_shards`): every client fits EiNets
(``--learner einet``) with Table 5's MNIST settings on random binary trees sized by scope
(:data:`MNIST_EINET`), and the centralized reference is one such EiNet over all pixels on all
training rows, timed in this process. Its log-likelihood is the paper's "log density": nats per
test image over the standardized pixels, the label marginalised. MNIST is subsampled to
:data:`MNIST_ROWS` rows unless ``--max-rows`` says otherwise (stratified, MNIST's own test
split kept). Without the data (or the einet learner) its cells are recorded as not run.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mpifc.experiments import paper, registry
from mpifc.errors import UserError
from mpifc.experiments.jobs import ShardCache, ShardSpec, central_learnspn, train_fc_cached, train_fc_uncached
from mpifc.experiments.launcher import Launcher
from mpifc.experiments.report import fmt, markdown_table, paper_fmt, provenance, short_error
from mpifc.experiments.store import NOT_RUN, OK, Cell, ResultStore, aggregate, run_cells, save_figure, write_csv, \
    write_h5_table

DATASETS = ("breast-cancer", "adult", "credit", "mnist")
SETTINGS = ("horizontal", "vertical", "hybrid")
QUICK_CLIENTS = {"horizontal": 3, "vertical": 2, "hybrid": 2}
QUICK_ROWS = 300
# Rounds of (FedPC job, centralized fit) per tabular cell; each side counts its fastest round.
TIMING_REPEATS = 3
SPLITS = ("paper", "label", "iid")
METRICS = ("test_ll", "relative_runtime", "train_seconds_critical_path", "central_seconds", "bytes_train")
# MNIST: rows (full run) and the EiNet every client (and the centralized reference) fits.
MNIST_ROWS = 6_000
QUICK_MNIST_ROWS = 600
# Table 5's MNIST column: K=10, 5 epochs, batches of 64, online EM every 5 batches with step
# 0.1, Gaussian leaves with variance in [1e-3, 0.25] (EiNetConfig's defaults). The structure is
# random binary trees (a vertical client's pixels are no rectangle for a Poon-Domingos graph),
# sized by scope: leaf regions of ~49 pixels (depth 4 over all 784 pixels, 3 over a vertical
# client's half), so a client's EiNet is as much smaller than the central one as its scope.
# One deviation: an M-step after every batch (online_em_frequency 1, not 5). Table 5's schedule
# is for all 60k images (~190 M-steps of 0.1 per epoch); on MNIST_ROWS rows it would make 16 per
# epoch, and a horizontal client (~1/5 of them) 3: 15 steps of 0.1 in 5 epochs leave it near its
# initialisation (measured on 1.3k rows: LL -1291 against the central -692), so the comparison
# would measure under-training. Every batch keeps EM near convergence at this size.
MNIST_EINET: dict[str, Any] = {"leaf": "gaussian", "num_sums": 10, "leaf_region_vars": 49, "repetitions": 2,
                               "epochs": 5, "batch_size": 64, "online_em_frequency": 1, "online_em_stepsize": 0.1,
                               "dtype": "float32"}
QUICK_MNIST_EINET: dict[str, Any] = {**MNIST_EINET, "num_sums": 2, "leaf_region_vars": 196, "repetitions": 1,
                                     "epochs": 1}


def einet_unavailable() -> str | None:
    """Why the MNIST row cannot run here, or ``None`` when it can."""
    try:
        import mpifc.circuit.einet as einet
    except ImportError as e:
        return f"mpifc.circuit.einet cannot be imported ({e})"
    if not any(hasattr(einet, f) for f in ("fit_einet", "learn_einet")):
        return "learner 'einet' is not usable: mpifc.circuit.einet has no fit_einet/learn_einet yet"
    from data_prep.files import default_data_root

    if not (Path(default_data_root()) / "mnist").exists():
        return "MNIST data not found under the data root"
    return None


# The paper's tabular leaves: "the leaves of the FedPC were parameterized with MSPNs" (and MSPNs
# are the centralized models too), i.e. SPFlow's learn_mspn with piecewise-linear leaves. Gaussian
# leaves on the target-encoded, standardized columns of Income/Credit (few distinct values stored
# as real) give constant slices a variance of min_var and +3.7 nats per such column, so their LL
# counts constant slices rather than fit (launch/bench/fedpc.py). Used on both sides of every ratio.
TABULAR_LEAF = "piecewise"


def hyperparameters(dataset: str, setting: str, quick: bool = False) -> tuple[dict[str, Any], str, str]:
    """(learner hyperparameters, glue, learner) for a cell: Table 4 with MSPN leaves (unless
    :func:`mpifc.experiments.paper.learnspn_hp` names a leaf) and SPFlow's RDC; EiNet for MNIST."""
    if dataset == "mnist":
        hp = dict(QUICK_MNIST_EINET if quick else MNIST_EINET)
        return hp, "random" if setting == "horizontal" else "combinatorial", "einet"
    hp, glue = paper.learnspn_hp(setting, dataset)
    hp = dict(hp)
    hp.setdefault("leaf", TABULAR_LEAF)
    return hp, glue, "learnspn"


def horizontal_split(dataset: str, choice: str = "paper") -> str:
    """The sample split of a horizontal cell: ``choice`` unless it is ``"paper"``.

    The paper says two things. Its text on Table 1 (section 4, first question): "each client received data from only a subset of
    classes in the horizontal case" (to show robustness to label shifts); appendix E: "In
    horizontal cases, we either split samples randomly across clients (done for all binary
    classification tasks) or we distribute a subset of the dataset corresponding to a certain
    label (e.g. the 0 in MNIST) to one client". ``"paper"`` follows the appendix, the more
    specific of the two: a random (``iid``) split for the binary tabular sets, a label split for
    MNIST. ``"label"`` reproduces the section's reading everywhere (with two classes over five clients
    the largest client then holds up to a quarter of the rows).
    """
    if choice not in SPLITS:
        raise UserError(f"table1: --horizontal-split must be one of {', '.join(SPLITS)}, got {choice!r}")
    if choice != "paper":
        return choice
    return "label" if dataset == "mnist" else "iid"


class SplitCheckedStore(ResultStore):
    """Table 1's cells: a finished cell counts as done only if it ran with the current horizontal
    split, number of timing rounds and critical-path definition (a stale one is run again)."""

    def __init__(self, out_dir: str | Path, split_choice: str, repeats: int) -> None:
        super().__init__(out_dir)
        self.split_choice, self.repeats = split_choice, repeats

    def done(self, cell: Cell) -> bool:
        rec = self.load(cell)
        if rec is None or rec.get("status") != OK:
            return False
        if cell.dataset == "mnist":
            return rec.get("setting") != "horizontal" or rec.get("split", "label") == horizontal_split(
                "mnist", self.split_choice)
        want = horizontal_split(cell.dataset, self.split_choice)
        # the split shapes the horizontal shards (and the central cell's hp provenance) only
        if cell.setting in ("horizontal", "central") and rec.get("horizontal_split", "label") != want:
            return False
        return cell.setting == "central" or (int(rec.get("timing_repeats", 1)) == self.repeats
                                             and rec.get("critical_path") == "learn+serialize+server")


def paper_hp(hp: dict[str, Any], shards: Path) -> dict[str, Any]:
    """A tabular cell's LearnSPN settings: Table 4 as stated (no cap on ``min_instances_slice``)
    plus SPFlow's RDC convention, on both sides of the cell's ratio.

    Table 7's experiments cap ``min_instances_slice`` at 10% of the smallest client's rows
    (:func:`mpifc.experiments.jobs.capped_hp`) so a client's label is not left independent of its
    features; Table 1 measures density and runtime, where a client smaller than
    ``min_instances_slice`` is fully factorised, as SPFlow's LearnSPN (the paper's) does. The cap
    never binds for Income or Credit (every client holds thousands of rows); for breast cancer
    (label split: the smallest client holds ~56 training rows) it would set 10, and the
    centralized LearnSPN on 455 rows with slices of 10 rows overfits (test LL -47.0 at seed 0,
    against -34.7 with Table 4's 300). ``smallest_client_rows_paper`` (provenance, as every
    ``*_paper`` key: not passed to the learner) records where a client cannot split.
    """
    from data_prep.shards import load_manifest
    from mpifc.experiments.paper import SPFLOW_RDC

    out = {**hp, **{k: v for k, v in SPFLOW_RDC.items() if k not in hp}}
    out["smallest_client_rows_paper"] = min(int(c["n_train"]) for c in load_manifest(shards).clients)
    return out


def learnspn_extra(hp: dict[str, Any]) -> dict[str, Any]:
    """``hp`` minus threshold / min_instances_slice and provenance keys: the other learn_spn options."""
    return {k: v for k, v in hp.items() if k not in ("threshold", "min_instances_slice") and not k.endswith("_paper")}


def central_reference(cache: ShardCache, dataset: str, seed: int, rows: int | None,
                      hp: dict[str, Any]) -> dict[str, Any]:
    """Centralized LearnSPN with exactly ``hp`` on all training rows of ``seed``, timed and
    evaluated (:func:`mpifc.experiments.jobs.central_learnspn`): the ``central`` cell."""
    d = cache.get(ShardSpec(dataset, "central", 1, seed, max_rows=rows))
    return central_learnspn(d, hp["threshold"], hp["min_instances_slice"], seed, **learnspn_extra(hp))


def central_timing(cache: ShardCache, dataset: str, seed: int, rows: int | None,
                   hp: dict[str, Any]) -> dict[str, Any]:
    """The denominator of a FedPC cell's relative runtime: centralized LearnSPN with exactly the
    cell's settings ``hp`` on all training rows of ``seed``, timed as
    :func:`~mpifc.experiments.jobs.central_learnspn` times it (same warm-up, CPU seconds of
    ``learn_spn`` only) but not evaluated: MSPN leaves make a test pass cost more than the fit.

    Returns:
        ``seconds`` (CPU), ``wall_seconds``, ``rows``.
    """
    from data_prep.shards import load_manifest, read_client
    from mpifc.circuit.learnspn import learn_spn
    from mpifc.fedpc.train import warm_up

    d = cache.get(ShardSpec(dataset, "central", 1, seed, max_rows=rows))
    m = load_manifest(d)
    shard = read_client(d, 0)
    order = m.feature_order
    x = shard.x_train[:, [shard.features.index(f) for f in order]]
    warm_up({"learnspn"}, cluster=False, fit=True)
    c0, w0 = time.process_time(), time.perf_counter()
    learn_spn(x, m.meta_types(order), threshold=hp["threshold"], min_instances_slice=hp["min_instances_slice"],
              seed=seed, **learnspn_extra(hp))
    return {"seconds": time.process_time() - c0, "wall_seconds": time.perf_counter() - w0, "rows": int(x.shape[0])}


def fit_critical_path(job: dict[str, Any]) -> float:
    """A training job's critical path without reading the shards: the slowest client's CPU
    seconds of ``learn`` + ``serialize`` (+ ``em``) plus the server's phases.

    The job's own ``train_seconds_critical_path`` also counts each client's ``read`` (opening
    its HDF5 shard: ~10-15 ms, a third of a breast-cancer client's whole path), while the
    centralized reference counts ``learn_spn`` alone, its data already in memory; this figure
    leaves reading out on both sides, as ``launch/bench/fedpc.py`` does. (Older MNIST cells
    used the job's figure.)
    """
    clients = job.get("client_seconds") or {}
    if not clients:
        return float(job["train_seconds_critical_path"])
    slowest = max(v.get("learn", 0.0) + v.get("serialize", 0.0) + v.get("em", 0.0) for v in clients.values())
    return slowest + sum((job.get("server_seconds") or {}).values())


def gathered_test_ll(shards: Path, model: Path, batch: int = 10_000) -> float:
    """Mean test log-likelihood (nats per row, every column, the target included) of a gathered
    FedPC file: the figure :func:`~mpifc.experiments.jobs.evaluate_fc` reports as ``test_ll``,
    without its per-class passes (accuracy is Table 7's)."""
    from data_prep.shards import read_test
    from mpifc.federated.evaluate import log_likelihood
    from mpifc.federated.serialize import load_fc

    test = read_test(shards)
    fc = load_fc(str(model), load_models=True)
    x = test.x.astype(np.float64)
    lls = [np.asarray(log_likelihood(fc, {f: x[lo:lo + batch, j] for j, f in enumerate(test.features)}),
                      dtype=np.float64) for lo in range(0, len(x), batch)]
    return float(np.concatenate(lls).mean())


def run(out_dir: str | Path, seeds: Sequence[int], quick: bool = False, datasets: Sequence[str] | None = None,
        settings: Sequence[str] | None = None, max_rows: int | None = None, shards: str | Path | None = None,
        timeout: float | None = None, progress: bool = True, launcher: Launcher | None = None,
        horizontal_split_choice: str = "paper", timing_repeats: int | None = None,
        **_: Any) -> dict[str, Any]:
    """Run (or resume) Table 1 into ``out_dir``; returns the summary (files, counts, markdown).

    Args:
        horizontal_split_choice: ``paper`` (appendix E: random for the binary tabular sets,
            label for MNIST), ``label`` or ``iid``: see :func:`horizontal_split`.
        timing_repeats: rounds of (job, centralized fit) per tabular FedPC cell (default
            :data:`TIMING_REPEATS`, 1 with ``quick``); each side counts its fastest.
    """
    horizontal_split("breast-cancer", horizontal_split_choice)  # validates the choice
    repeats = (1 if quick else TIMING_REPEATS) if timing_repeats is None else int(timing_repeats)
    if repeats < 1:
        raise UserError(f"table1: --timing-repeats must be >= 1, got {timing_repeats!r}")
    out = Path(out_dir)
    store = SplitCheckedStore(out, horizontal_split_choice, repeats)
    # image sets other than MNIST are table2's (EiNets of GPU size)
    datasets = [d for d in (datasets or (("breast-cancer",) if quick else DATASETS))
                if d == "mnist" or not paper.is_image_set(d)]
    settings = list(settings or SETTINGS)
    rows = max_rows if max_rows is not None else (QUICK_ROWS if quick else None)
    clients = QUICK_CLIENTS if quick else paper.TABLE1_CLIENTS
    cache = ShardCache(shards or out / "shards")
    launch = launcher or Launcher(timeout=timeout or (600 if quick else 6 * 3600))
    no_einet = einet_unavailable() if "mnist" in datasets else None

    cells = []
    # Seed-major: an interrupted (resumable) run holds whole seeds of every dataset.
    for seed in seeds:
        for ds in datasets:
            cells.append(Cell(ds, "central", 1, "einet" if ds == "mnist" else "learnspn", seed))
            cells += [Cell(ds, st, clients[st], "fedpc", seed) for st in settings]

    mnist_rows = max_rows if max_rows is not None else (QUICK_MNIST_ROWS if quick else MNIST_ROWS)

    def work(cell: Cell) -> dict[str, Any]:
        if cell.dataset == "mnist" and no_einet:
            return {"status": NOT_RUN, "reason": no_einet}
        if cell.dataset == "mnist":
            return mnist_cell(cell, cache, launch, mnist_rows, quick, horizontal_split_choice)
        if cell.setting == "central":
            # Like for like: the horizontal FedPC cell's LearnSPN settings, min_instances_slice
            # capped as there (by its smallest client), not by the one central client's rows.
            hp, _, _ = hyperparameters(cell.dataset, "horizontal")
            hsplit = horizontal_split(cell.dataset, horizontal_split_choice)
            dh = cache.get(ShardSpec(cell.dataset, "horizontal", clients["horizontal"], cell.seed, split=hsplit,
                                     max_rows=rows))
            hp = paper_hp(hp, dh)
            res = central_reference(cache, cell.dataset, cell.seed, rows, hp)
            return {"test_ll": res["test_ll"], "central_seconds": res["seconds"],
                    "central_wall_seconds": res["wall_seconds"], "rows": res["rows"], "hp": hp,
                    "horizontal_split": hsplit, "load_average": _load()}
        hp, glue, learner = hyperparameters(cell.dataset, cell.setting)
        hsplit = horizontal_split(cell.dataset, horizontal_split_choice)
        split = hsplit if cell.setting == "horizontal" else "iid"
        d = cache.get(ShardSpec(cell.dataset, cell.setting, cell.clients, cell.seed, split=split, max_rows=rows))
        hp = paper_hp(hp, d)
        load0 = _load()
        kw = {"learner": learner, "glue": glue, "seed": cell.seed, "hp": hp}
        # --warm-up: the FC clients' fit seconds exclude start-up, as the centralized reference's do
        tr = train_fc_cached(launch, d, cache.runs, extra=("--warm-up",), **kw)
        # The denominator: centralized LearnSPN with this cell's own settings (Table 4 differs
        # per setting), measured right after the job, so the same load weighs on both sides.
        ref = central_timing(cache, cell.dataset, cell.seed, rows, hp)
        cps, cents, walls = [fit_critical_path(tr)], [ref["seconds"]], [ref["wall_seconds"]]
        job_cps = [tr["train_seconds_critical_path"]]
        for _ in range(repeats - 1):  # more rounds, alternating: each side keeps its fastest
            again = train_fc_uncached(launch, d, cache.runs, **kw)
            if (again["n_parameters"], again["bytes_train"]) != (tr["n_parameters"], tr["bytes_train"]):
                raise RuntimeError(f"table1 {cell.dataset}/{cell.setting} seed {cell.seed}: a timing round trained "
                                   f"another model ({again['n_parameters']} parameters, {again['bytes_train']} B "
                                   f"against {tr['n_parameters']}, {tr['bytes_train']})")
            cps.append(fit_critical_path(again))
            job_cps.append(again["train_seconds_critical_path"])
            r2 = central_timing(cache, cell.dataset, cell.seed, rows, hp)
            cents.append(r2["seconds"])
            walls.append(r2["wall_seconds"])
        load1 = _load()
        return {"test_ll": gathered_test_ll(d, Path(tr["model_path"])),
                "central_seconds": min(cents), "central_wall_seconds": walls[int(np.argmin(cents))],
                "central_seconds_runs": cents, "train_seconds_critical_path_runs": cps,
                "timing_repeats": repeats, "horizontal_split": hsplit,
                "train_seconds_critical_path_job": min(job_cps), "critical_path": "learn+serialize+server",
                "load_average": [load0, load1],
                "train_seconds_critical_path": min(cps),
                "train_seconds_total": tr["train_seconds_total"], "bytes_train": tr["bytes_train"],
                "messages_train": tr["messages_train"], "n_parameters": tr["n_parameters"], "ranks": tr["ranks"],
                "hp": hp, "glue": glue, "learner": learner, "split": split, "shards": str(d),
                "model": tr["model_path"], "ledger": tr["ledger_path"], "cached_run": tr["cached"]}

    records, counts = run_cells(store, cells, work, "table1", progress)
    add_relative_runtime(records)
    return write_outputs(out, records, counts, seeds, quick, datasets, settings, rows,
                         mnist_rows if "mnist" in datasets else None, horizontal_split_choice, repeats)


# torchvision's MNIST normalisation ("the MNIST dataset provided by pytorch ... standardized"):
# x = (level / 255 - MEAN) / STD, one mean and deviation for every pixel.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def mnist_shards(cache: ShardCache, spec: ShardSpec) -> Path:
    """MNIST shards with the pixels standardized as the paper's (torchvision's ``Normalize``:
    ``(level / 255 - 0.1307) / 0.3081``, one affine map for all pixels, real-valued), cached.

    A per-column standardization would divide rarely lit border pixels by tiny deviations and
    turn them into outliers dozens of deviations out; the global map keeps every pixel in
    ``[-0.42, 2.82]``, where Table 5's variance clamp ``[1e-3, 0.25]`` makes sense.
    """
    from data_prep import write_shards
    from data_prep.datasets import load_dataset
    from data_prep.prepare import PrepConfig, prepare_table

    d = cache.root / (spec.dirname() + "-norm")
    if not (d / "manifest.json").exists():
        table = load_dataset("mnist")
        cfg = PrepConfig(dataset="mnist", setting=spec.setting, clients=spec.clients, seed=spec.seed,
                         split=spec.split, max_rows=spec.max_rows, standardize=False)
        if spec.max_rows is not None and spec.max_rows < table.n_rows:
            # subsample before converting to floats (as prepare_table would, same rows)
            from data_prep.prepare import _groups, stratified_pick
            from data_prep.partition import stage_rng

            table = table.take(stratified_pick(_groups(table), spec.max_rows, stage_rng(spec.seed, 6)))
        x = (table.x.astype(np.float64) / 255.0 - MNIST_MEAN) / MNIST_STD
        table.x, table.meta_types, table.pixel = x, ["real"] * x.shape[1], None
        write_shards(prepare_table(table, cfg), d)
    return d


def pixel_log_density(shards: Path, model: Any, batch: int = 2000) -> float:
    """Mean test log density (nats per image) over the pixels, the label marginalised.

    ``model`` is a gathered FedPC file (a path) or a single fitted EiNet over ``feature_order``.
    """
    from data_prep.shards import load_manifest, read_test

    m = load_manifest(shards)
    test = read_test(shards)
    x = test.x.astype(np.float64)
    if m.target is not None and m.target in test.features:
        x[:, test.features.index(m.target)] = np.nan
    if isinstance(model, (str, Path)):
        from mpifc.federated.evaluate import log_likelihood
        from mpifc.federated.serialize import load_fc

        fc = load_fc(str(model), load_models=True)
        lls = [np.asarray(log_likelihood(fc, {f: x[lo:lo + batch, j] for j, f in enumerate(test.features)}))
               for lo in range(0, len(x), batch)]
    else:
        order = [test.features.index(f) for f in m.feature_order]
        lls = [np.asarray(model.log_likelihood(x[lo:lo + batch][:, order]), dtype=np.float64)
               for lo in range(0, len(x), batch)]
    return float(np.concatenate(lls).mean())


def central_einet(shards: Path, hp: dict[str, Any], seed: int) -> dict[str, Any]:
    """One EiNet on the one-client shards, timed in this process in CPU seconds."""
    from data_prep.shards import load_manifest, read_client
    from mpifc.circuit.einet import fit_einet

    m = load_manifest(shards)
    shard = read_client(shards, 0)
    x = shard.x_train[:, [shard.features.index(f) for f in m.feature_order]]
    import torch  # noqa: F401 - imported before the clock starts, as fc_train's warm_up does

    # CPU seconds (process_time), as FedPC's critical path counts them: a shared machine's
    # load would inflate wall seconds of this one process and not those of the ranks.
    t0, w0 = time.process_time(), time.perf_counter()
    model = fit_einet(x, m.meta_types(m.feature_order), seed=seed, **hp)
    seconds, wall = time.process_time() - t0, time.perf_counter() - w0
    return {"central_seconds": seconds, "central_wall_seconds": wall, "test_ll": pixel_log_density(shards, model), "rows": int(x.shape[0]),
            "n_parameters": int(model.num_parameters())}


def mnist_cell(cell: Cell, cache: ShardCache, launch: Launcher, rows: int | None, quick: bool,
               split_choice: str = "paper") -> dict[str, Any]:
    """An MNIST cell: EiNet leaves on standardized pixels, log density of the pixels."""
    hp, glue, learner = hyperparameters("mnist", cell.setting, quick)
    if cell.setting == "central":
        d = mnist_shards(cache, ShardSpec("mnist", "central", 1, cell.seed, max_rows=rows))
        return {**central_einet(d, hp, cell.seed), "hp": hp, "learner": learner, "shards": str(d),
                "load_average": _load()}
    split = horizontal_split("mnist", split_choice) if cell.setting == "horizontal" else "iid"
    d = mnist_shards(cache, ShardSpec("mnist", cell.setting, cell.clients, cell.seed, split=split, max_rows=rows))
    tr = train_fc_cached(launch, d, cache.runs, learner=learner, glue=glue, seed=cell.seed, hp=hp,
                         extra=("--warm-up",))
    return {"test_ll": pixel_log_density(d, Path(tr["model_path"])), "load_average": _load(),
            "train_seconds_critical_path": fit_critical_path(tr), "critical_path": "learn+serialize+server",
            "train_seconds_critical_path_job": tr["train_seconds_critical_path"],
            "train_seconds_total": tr["train_seconds_total"], "bytes_train": tr["bytes_train"],
            "messages_train": tr["messages_train"], "n_parameters": tr["n_parameters"], "ranks": tr["ranks"],
            "hp": hp, "glue": glue, "learner": learner, "split": split, "shards": str(d),
            "model": tr["model_path"], "ledger": tr["ledger_path"], "cached_run": tr["cached"]}


def _load() -> float | None:
    """The 1-minute load average (the machine is shared: recorded beside every timing)."""
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def add_relative_runtime(records: list[dict[str, Any]]) -> None:
    """Set each FedPC record's ``relative_runtime``: its critical path over its own centralized
    reference (``central_seconds``, same settings, tabular cells), else over the central cell of
    its dataset and seed (MNIST)."""
    central = {(r["dataset"], r["seed"]): r.get("central_seconds") for r in records
               if r["setting"] == "central" and r.get("status") == OK}
    for r in records:
        if r["setting"] == "central":
            r["relative_runtime"] = 1.0 if r.get("status") == OK else None
        elif r.get("status") == OK:
            c = r.get("central_seconds") or central.get((r["dataset"], r["seed"]))
            r["relative_runtime"] = r["train_seconds_critical_path"] / c if c else None


def write_outputs(out: Path, records: list[dict[str, Any]], counts: dict[str, int], seeds: Sequence[int],
                  quick: bool, datasets: Sequence[str], settings: Sequence[str], rows: int | None,
                  mnist_rows: int | None = None, split_choice: str = "paper", repeats: int = 1) -> dict[str, Any]:
    agg = aggregate(records, METRICS)
    files = [write_csv(out / "cells.csv", records), write_h5_table(out / "cells.h5", records),
             write_csv(out / "summary.csv", agg)]
    by = {(a["dataset"], a["setting"]): a for a in agg}
    header = ["dataset", "", "LL cent.", *[f"LL {s}" for s in settings], *[f"rel. runtime {s}" for s in settings],
              "cent. CPU s"]
    table = []
    for ds in datasets:
        name = paper.PAPER_NAMES.get(ds, ds)
        ours = [name, "ours"]
        digits = 0 if ds == "mnist" else 2
        for st in ("central", *settings):
            a = by.get((ds, st))
            ours.append(fmt(a["test_ll_mean"], a["test_ll_std"], digits) if a and a["status"] == OK
                        else short_error(a))
        for st in settings:
            a = by.get((ds, st))
            ours.append(fmt(a["relative_runtime_mean"], a["relative_runtime_std"]) if a and a["status"] == OK
                        else "–")
        # the centralized fit's size: ratios of sub-second fits measure per-job fixed costs
        c = by.get((ds, "central"))
        ours.append(fmt(c["central_seconds_mean"], c["central_seconds_std"]) if c and c["status"] == OK else "–")
        pl = paper.TABLE1_LL.get(ds, {})
        pr = paper.TABLE1_RUNTIME.get(ds, {})
        table.append(ours)
        table.append([name, "paper", *[paper_fmt(pl.get(st), 1) for st in ("central", *settings)],
                      *[paper_fmt(pr.get(st)) for st in settings], "–"])
    clients = QUICK_CLIENTS if quick else paper.TABLE1_CLIENTS
    extra_mnist = {}
    if mnist_rows is not None or "mnist" in datasets:
        hp = QUICK_MNIST_EINET if quick else MNIST_EINET
        extra_mnist = {
            "MNIST": f"{mnist_rows or 'all'} rows, pixels standardized as torchvision's Normalize(0.1307, 0.3081); "
                     "every client fits EiNets (Table 5's "
                     "MNIST settings on random binary trees sized by scope: leaf regions of leaf_region_vars "
                     "pixels; " + ", ".join(f"{k}={v}" for k, v in hp.items()) + "), the centralized reference "
                     "is one such EiNet on all training rows (CPU seconds in this process); LL = log density of the pixels in nats per image "
                     "(label marginalised), as the paper reports it; horizontal: "
                     f"{horizontal_split('mnist', split_choice)} split",
        }
    md = provenance("Table 1: log-likelihood and relative runtime", seeds, quick, {
        "clients": ", ".join(f"{s} {clients[s]}" for s in settings),
        "horizontal split": (f"--horizontal-split {split_choice}: "
                             + ("random (iid) for the binary tabular sets, label split for MNIST, as appendix E "
                                "states (section 4's text speaks of label subsets; `--horizontal-split label` runs that)"
                                if split_choice == "paper" else f"{split_choice} for every dataset")),
        "rows per dataset": rows or ("all" if set(datasets) != {"mnist"} else mnist_rows),
        "log-likelihood": "mean test log-likelihood per row in nats, target column included (MNIST: see below)",
        "relative runtime": "FedPC critical-path training CPU seconds (slowest client's learn + serialize, "
                            "plus the server; reading the shards is left out on both sides; all ranks "
                            "learning at once on this shared machine: contended) / CPU seconds of a "
                            "centralized LearnSPN with the cell's own settings on all training rows, run "
                            "in this process right after the job (process_time after the same warm-up as "
                            f"a client rank); tabular cells: {repeats} alternating round(s) of job and "
                            "centralized fit, each side its fastest (every round is in the cells); MNIST: / the central EiNet cell of the same seed; 1-minute "
                            "load averages are in the cells (load_average)",
        "hyperparameters": "Table 4 as stated (threshold, min_instances_slice, glue; no cap: a client "
                           "with fewer rows is fully factorised, as in SPFlow), MSPN leaves "
                           f"(leaf={TABULAR_LEAF}, as the paper's MSPNs), RDC as SPFlow's LearnSPN (k=20, "
                           "ties ranked in row order: mpifc.experiments.paper.SPFLOW_RDC); the same "
                           "settings on both sides of every ratio; LL cent. uses the horizontal cell's",
        **_measures(records),
        **extra_mnist,
    }) + "\n" + markdown_table(header, table) + "\n"
    files.append(_write_md(out / "table1.md", md))
    note = (f"seeds {','.join(str(s) for s in seeds)}; rows: {f'at most {rows}' if rows else 'all'}; "
            f"horizontal split {split_choice}; {repeats} timing round(s) per cell"
            + (" -- quick (smoke test)" if quick else ""))
    files.append(plot(out / "table1.png", agg, datasets, settings, note))
    return {"files": [str(f) for f in files], "counts": counts, "markdown": md, "records": records,
            "aggregate": agg}


def _measures(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per tabular dataset: what data_prep made of its columns and what its LL measures (from the
    shards of its first finished FedPC cell)."""
    from data_prep.shards import load_manifest
    from mpifc.experiments.report import describe_preprocessing
    from mpifc.federated.bpd import ll_measure

    out: dict[str, str] = {}
    for r in records:
        ds = r.get("dataset")
        if ds == "mnist" or r.get("status") != OK or not r.get("shards") or f"measure ({ds})" in out:
            continue
        raw = load_manifest(Path(r["shards"])).raw
        out[f"preprocessing ({ds})"] = describe_preprocessing(raw)
        out[f"measure ({ds})"] = ll_measure(raw)["text"]
    return out


def _write_md(path: Path, text: str) -> Path:
    from mpifc.atomic import atomic_write_text

    return atomic_write_text(path, text)


def plot(path: Path, agg: list[dict[str, Any]], datasets: Sequence[str], settings: Sequence[str],
         note: str = "") -> Path:
    """Two panels: FedPC LL minus centralized LL, and relative runtime; ours beside the paper's.

    ``note`` (seeds, rows, split, timing rounds) is the title's second line; legends sit right of
    the axes, clear of the bars.
    """
    from matplotlib.figure import Figure

    by = {(a["dataset"], a["setting"]): a for a in agg}
    labels, gap_ours, gap_paper, rt_ours, rt_paper, gap_err, rt_err = [], [], [], [], [], [], []
    for ds in datasets:
        c = by.get((ds, "central"))
        pc = paper.TABLE1_LL.get(ds, {}).get("central")
        for st in settings:
            a = by.get((ds, st))
            labels.append(f"{paper.PAPER_NAMES.get(ds, ds)}\n{st}")
            ok = a is not None and a["status"] == OK and c is not None and c["status"] == OK
            gap_ours.append(a["test_ll_mean"] - c["test_ll_mean"] if ok else float("nan"))
            gap_err.append(a["test_ll_std"] if ok else 0.0)
            p = paper.TABLE1_LL.get(ds, {}).get(st)
            gap_paper.append(p[0] - pc[0] if p and pc else float("nan"))
            rt_ours.append(a["relative_runtime_mean"] if a and a["status"] == OK else float("nan"))
            rt_err.append(a["relative_runtime_std"] if a and a["status"] == OK else 0.0)
            q = paper.TABLE1_RUNTIME.get(ds, {}).get(st)
            rt_paper.append(q[0] if q else float("nan"))
    fig = Figure(figsize=(max(6.0, 1.1 * len(labels) + 2), 6.5), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1)
    xs = list(range(len(labels)))
    w = 0.38
    ax1.bar([x - w / 2 for x in xs], gap_ours, w, yerr=gap_err, label="ours", color="tab:blue")
    ax1.bar([x + w / 2 for x in xs], gap_paper, w, label="paper", color="tab:gray")
    ax1.axhline(0, color="black", lw=0.8)
    ax1.set_ylabel("LL(FedPC) − LL(central) [nats]")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax2.bar([x - w / 2 for x in xs], rt_ours, w, yerr=rt_err, label="ours", color="tab:green")
    ax2.bar([x + w / 2 for x in xs], rt_paper, w, label="paper", color="tab:gray")
    ax2.axhline(1.0, color="black", lw=0.8, ls="--")
    ax2.set_ylabel("relative runtime (central = 1)")
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Table 1: FedPC against centralized LearnSPN" + (f"\n{note}" if note else ""), fontsize=10)
    return save_figure(fig, path)


registry.register("table1", "Table 1: log-likelihood and relative runtime, LearnSPN vs FedPC", run)
