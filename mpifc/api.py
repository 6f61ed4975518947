"""The Python API: a trained federated circuit as an object, in one process, without MPI.

    import mpifc
    fc = mpifc.load("fc.h5")
    fc.features, fc.classes
    fc.predict_proba(df)            # (n, k) rows summing to 1, columns in the order of fc.classes
    fc.predict(df)                  # labels
    fc.log_likelihood(df)           # (n,) nats; empty cells and left-out columns are marginalised
    fc.marginal(df, keep=["age"])   # log p(age) alone
    fc.mpe(df); fc.sample(10, seed=0)

``X`` is a pandas DataFrame (or a dict of columns) in the user's units and labels, matched by
column name, or a numpy array ``(n, len(features))`` in model units and :attr:`features` order
(NaN = missing). Every method returns numpy arrays: rows come back in the units of the input
(object arrays of user values and labels for a DataFrame: discrete columns as ints, labels as
the file had them; float64 model units for an array). A value the model does not know (a label
never seen in training, a fractional or unseen value of a discrete column) raises
:class:`~mpifc.errors.UserError` naming the row and column, unless the model was loaded with
``clip=True`` (``mpifc query --clip``): then it is read as the nearest value the model knows.

:func:`simulate` runs one-pass training in this process: the same model as ``mpiexec ... mpifc
train`` for the same shards, settings and seed, without MPI.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from mpifc.errors import UserError

__all__ = ["FederatedModel", "load", "simulate"]


class FederatedModel:
    """A trained federated circuit with its preprocessing (see the module docstring).

    Attributes:
        features: the model's columns, in model order (the target last, if any).
        target: the target column, or None.
        classes: the target's labels (the columns of :meth:`predict_proba`), or None.
    """

    def __init__(self, fc: Any, codec: Any = None, path: str | None = None, clip: bool = False) -> None:
        from data_prep.codec import RowCodec

        self.fc = fc
        self.path = path
        self.clip = bool(clip)
        stored = fc.meta.get("codec") if codec is None else None
        if codec is None:
            codec = RowCodec.from_json(stored) if stored else RowCodec(fc.features, fc.target, _default_classes(fc))
        self.codec = codec
        if list(codec.features) != list(fc.features):
            codec.features = list(fc.features)  # model column order rules; the codec maps by name
        self._programs: dict[str | None, Any] = {}

    # ------------------------------------------------------------------ description
    @property
    def features(self) -> list[str]:
        return list(self.fc.features)

    @property
    def target(self) -> str | None:
        return self.fc.target

    @property
    def classes(self) -> list[Any] | None:
        """The target's labels as the user's file had them (ints where all are whole numbers)."""
        if self.target is None:
            return None
        return self.codec.typed_labels(self.target) or _default_classes(self.fc)

    def __repr__(self) -> str:
        return (f"FederatedModel({self.path or 'in memory'}: {len(self.fc.clients)} clients, "
                f"{len(self.features)} features, target {self.target!r})")

    # ------------------------------------------------------------------ conversions
    def encode(self, X: Any, source: str = "input", first_row: int = 1) -> np.ndarray:
        """``X`` (DataFrame or dict of columns, user units) as model rows ``(n, D)``; an array
        passes through after a shape check. ``first_row``: the number of ``X``'s first row in
        ``source`` (error messages name rows)."""
        rows, _ = self._rows(X, source, first_row)
        return rows

    def decode(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Model rows ``(n, D)`` as ``{column: values}`` in user units and labels."""
        return self.codec.decode(rows)

    def _rows(self, X: Any, source: str = "input", first_row: int = 1) -> tuple[np.ndarray, bool]:
        """``(model rows (n, D), whether X was in user units)``."""
        if isinstance(X, np.ndarray) and X.dtype != object:
            arr = np.asarray(X, dtype=np.float64)
            if arr.ndim != 2 or arr.shape[1] != len(self.features):
                raise UserError(f"{source}: an array needs shape (n, {len(self.features)}) over {self.features} "
                                f"in model units, got {arr.shape}; pass a DataFrame for user units")
            return arr, False
        if _is_dataframe(X):
            cols = {str(c): X[c].to_numpy() for c in X.columns}
        elif isinstance(X, Mapping):
            cols = {str(k): list(np.asarray(v, dtype=object).reshape(-1)) for k, v in X.items()}
        else:
            raise UserError(f"{source}: expected a pandas DataFrame, a dict of columns or a numpy array, "
                            f"got {type(X).__name__}")
        return self.codec.encode(cols, source=source, first_row=first_row, clip=self.clip), True

    def _out_rows(self, rows: np.ndarray, user: bool) -> np.ndarray:
        if not user:
            return rows
        dec = self.codec.decode(rows)
        out = np.empty(rows.shape, dtype=object)
        for j, f in enumerate(self.features):
            out[:, j] = dec[f]
        return out

    # ------------------------------------------------------------------ queries
    def root_values(self, rows: np.ndarray, target: str | None = None) -> np.ndarray:
        """The root's log-values of model rows ``(n, D)``: ``(n, 1)`` ``log p(x)``, or with
        ``target`` ``(n, k)`` ``log p(target = c, rest of x)`` (the target's cells ignored).

        Evaluated by :class:`~mpifc.federated.flat.FlatCircuit` (the whole circuit as one flat
        numpy program, compiled on the first query per target), which equals the reference
        upward pass (:mod:`mpifc.federated.evaluate`) up to floating-point summation order.
        Later changes to :attr:`fc` are not seen by a program already compiled.
        """
        program = self._programs.get(target)
        if program is None:
            from mpifc.federated.flat import FlatCircuit

            program = self._programs[target] = FlatCircuit(self.fc, target)
        return program.root_values(rows)

    def log_likelihood(self, X: Any) -> np.ndarray:
        """``log p(x)`` per row, float64 ``(n,)`` nats (model units: densities of standardised
        real columns); missing cells are marginalised."""
        rows, _ = self._rows(X)
        return self.root_values(rows)[:, 0]

    def marginal(self, X: Any, keep: Sequence[str]) -> np.ndarray:
        """``log p(x_keep)`` per row, float64 ``(n,)`` nats: every other column marginalised."""
        rows, _ = self._rows(X)
        return self.root_values(self.keep_columns(rows, keep))[:, 0]

    def keep_columns(self, rows: np.ndarray, keep: Sequence[str], flag: str = "keep") -> np.ndarray:
        """``rows`` with every column but ``keep`` blanked (NaN: marginalised)."""
        keep = list(keep)
        unknown = [k for k in keep if k not in self.features]
        if unknown:
            raise UserError(f"{flag}: unknown column {unknown[0]!r}; the model's columns are {', '.join(self.features)}")
        masked = np.full_like(rows, np.nan)
        idx = [self.features.index(k) for k in keep]
        masked[:, idx] = rows[:, idx]
        return masked

    def class_log_joint(self, rows: np.ndarray, target: str | None = None) -> np.ndarray:
        """``log p(target = c, rest of the row)`` of model rows, ``(n, k)`` nats."""
        return self.root_values(rows, self.resolve_target(target))

    def predict_proba(self, X: Any, target: str | None = None) -> np.ndarray:
        """``p(target = c | the rest of the row)`` ``(n, k)``; rows sum to 1, columns in the order
        of :attr:`classes` (of ``target``'s labels when another discrete column is named)."""
        rows, _ = self._rows(X)
        return proba_from_joint(self.class_log_joint(rows, target))

    def predict(self, X: Any, target: str | None = None) -> np.ndarray:
        """The most probable label of ``target`` per row ``(n,)`` (labels, not codes)."""
        t = self.resolve_target(target)
        codes = np.argmax(self.predict_proba(X, t), axis=1)
        labels = self.codec.typed_labels(t)
        if labels is None:
            return codes.astype(np.int64)
        out = np.empty(len(codes), dtype=object)
        out[:] = [labels[c] for c in codes]
        return out

    def mpe(self, X: Any) -> np.ndarray:
        """The most probable completion of every row's missing cells ``(n, D)``; observed cells are
        kept. In the units of ``X``."""
        from mpifc.federated.mpe import mpe_reference

        rows, user = self._rows(X)
        cols = {f: rows[:, j] for j, f in enumerate(self.features)}
        return self._out_rows(mpe_reference(self.fc, cols), user)

    def sample(self, n: int, evidence: Any = None, seed: int | None = None, units: str = "user") -> np.ndarray:
        """``n`` samples ``(n, D)``; with ``evidence`` (``n`` rows, missing cells free), from the
        conditional given each row's observed cells, which are kept.

        Args:
            n: the number of samples (the number of evidence rows, if given).
            evidence: rows in the units of the output (DataFrame: user units; array: model units).
            seed: the same seed gives the same samples (here and in ``mpifc query``).
            units: without evidence, ``"user"`` (object array of user values and labels) or
                ``"model"`` (float64).
        """
        from mpifc.federated.mpe import sample_conditional_seeded, sample_seeded

        if units not in ("user", "model"):
            raise UserError(f"units must be 'user' or 'model', not {units!r}")
        seed = 0 if seed is None else int(seed)
        if evidence is None:  # as ``mpifc evaluate --query sample`` draws them
            return self._out_rows(sample_seeded(self.fc, int(n), seed), units == "user")
        rows, user = self._rows(evidence, "evidence")
        if len(rows) != int(n):
            raise UserError(f"evidence has {len(rows)} rows, but n = {n}")
        cols = {f: rows[:, j] for j, f in enumerate(self.features)}
        return self._out_rows(sample_conditional_seeded(self.fc, cols, seed), user)

    def resolve_target(self, target: str | None) -> str:
        """``target``, or the model's own target when None (UserError if there is none)."""
        t = target or self.target
        if t is None:
            raise UserError("this model has no target column; name one with target=")
        if t not in self.features:
            raise UserError(f"target {t!r} is not a column of the model ({', '.join(self.features)})")
        return t


def proba_from_joint(joint: np.ndarray) -> np.ndarray:
    """Class log-joints ``(n, k)`` normalised per row into probabilities (a row whose classes
    are all impossible gives NaN)."""
    m = np.max(joint, axis=1, keepdims=True) if joint.size else np.zeros((len(joint), 1))
    with np.errstate(invalid="ignore"):
        e = np.exp(joint - np.where(np.isfinite(m), m, 0.0))
        return e / e.sum(axis=1, keepdims=True)


def _default_classes(fc: Any) -> list[str] | None:
    if fc.target is None:
        return None
    return [str(c) for c in range(int(fc.n_categories.get(fc.target, 0) or 0))]


def _is_dataframe(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "pandas" and hasattr(x, "columns")


def _check_device(device: str | None) -> None:
    """Refuse, before any work, a ``device`` that is malformed or an explicit ``cuda``/``cuda:N``
    that names no GPU of this machine."""
    from mpifc.runtime.device import device_problem, wants_cuda

    if wants_cuda(device):
        problem = device_problem(0, device)
        if problem:
            import socket

            raise UserError(f"device={device!r} on host {socket.gethostname()}: {problem}")


def _device(device: str | None, needed: bool) -> str | None:
    """This process's device as a string for ``device`` (auto, cpu, cuda, cuda:N) when a model
    computes on torch (``needed``), else None (nothing resolved, torch not imported)."""
    from mpifc.runtime.device import select_device

    return str(select_device(0, device)) if needed else None


def load(path: str | os.PathLike, device: str | None = "auto", clip: bool = False) -> FederatedModel:
    """A model file written by ``mpifc train`` (or :func:`simulate`), ready to query.

    Args:
        path: the model file.
        device: where its EiNet and RAT-SPN leaf PCs compute: ``"auto"`` (the default: the first
            GPU where CUDA is there, else the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Other
            leaves (LearnSPN, FC[DT], factorised) compute on the CPU. The file holds CPU arrays
            whatever device trained it, so any device reads it.
        clip: read a value the model does not know as the nearest one it knows, instead of
            refusing it (module doc).

    Raises:
        UserError: a file that is not an mpifc model, naming it; a device that is not there.
    """
    from mpifc.federated.placement import needs_device, place_models
    from mpifc.federated.serialize import load_fc

    _check_device(device)
    fc = load_fc(path, load_models=True)
    fc.validate(require_models=True)
    place_models(fc, _device(device, needs_device(fc)))
    return FederatedModel(fc, path=str(path), clip=clip)


def _simulate_em(fc: Any, datas: list[Any], setting: str, iters: int, rows: int | None = None,
                 seed: int = 0, leaves: bool = False) -> None:
    """``--refine em`` in one process: exact EM on the clients' aligned rows (vertical; with
    ``rows``, sampled EM on that many of them, :mod:`mpifc.federated.sampled_em`), or on the
    pooled statistics of their rows (horizontal, hybrid), as the MPI job computes it."""
    from mpifc.federated.em import check_em_supported, em_step, pooled_em_step

    check_em_supported(fc)
    shards = [{f: d.shard.x_train[:, j] for j, f in enumerate(d.shard.features)} for d in datas]
    if setting == "vertical" and rows:
        from mpifc.circuit.privacy import MomentGuard
        from mpifc.federated.sampled_em import run_single_process
        from mpifc.fedpc.train import client_rare_values

        guards = {c: MomentGuard(client_rare_values(d.shard)) for c, d in enumerate(datas)}
        run_single_process(fc, {f: v for cols in shards for f, v in cols.items()}, iters, rows, seed, leaves=leaves,
                           guards=guards)
        return
    for _ in range(iters):
        if setting == "vertical":
            em_step(fc, {f: v for cols in shards for f, v in cols.items()})
        else:
            pooled_em_step(fc, shards)


def simulate(shards: str | os.PathLike, *, learner: str = "learnspn", glue: str | None = None,
             clusters: int | None = None, preset: str = "adaptive", products: int = 4, seed: int = 0, hyperparameters: Mapping[str, Any] | None = None,
             client_learners: Mapping[int, str] | None = None, assign: str = "flat", servers: int = 0,
             refine: str | None = None, em_iters: int | None = None, em_rows: int | None = None,
             em_leaves: bool = False, model: str | os.PathLike | None = None, device: str | None = "auto",
             overwrite: bool = False) -> FederatedModel:
    """One-pass FedPC training in this process, as ``mpifc train`` does it over MPI.

    Every client's fit runs the same code, on the same rows, with the same plan and seeds as in
    the MPI job, so the model equals the one ``mpiexec -n C+1 mpifc train SHARDS`` writes with
    the same settings (its parameters, structure and answers; the file's timings differ).

    Args:
        shards: a shard folder written by ``python -m data_prep``.
        learner, glue, clusters, preset, products, seed, hyperparameters, client_learners, assign,
            servers, refine, em_iters, em_rows, em_leaves: as the flags of ``mpifc train`` (``hyperparameters`` =
            ``--hp``, checked; ``glue``, ``clusters``, ``refine`` and ``em_iters`` None: the
            preset's, as when the flags are not given). ``refine="em"`` runs the same exact EM
            in this process (vertical: on the clients' aligned rows; otherwise on pooled
            statistics).
        model: also write the model file here (atomically); it may replace only an earlier
            model file (unless ``overwrite``), never a shard or a file the shards were made from.
        overwrite: as ``mpifc train --overwrite``.
        device: where EiNet and RAT-SPN clients fit (and the model then answers), as in
            :func:`load`; LearnSPN, FC[DT] and factorised leaves fit on the CPU.
    """
    from data_prep.shards import load_manifest
    from mpifc.federated.assign import assign as assign_psi
    from mpifc.federated.assign import client_rank_map
    from mpifc.federated.hyperparameters import check_hyperparameters
    from mpifc.federated.one_pass import insert_models
    from data_prep.shards import input_files, source_files
    from mpifc.atomic import Output, check_outputs
    from mpifc.federated.serialize import MODEL_OUTPUT, SOURCES, save_fc
    from mpifc.fedpc.data import read_client_data
    from mpifc.fedpc.job import resolve_glue_and_refine
    from mpifc.fedpc.train import (builder_from_config, client_plan, fit_client, model_codec, recorded_sources,
                                   released)

    from mpifc.federated.defaults import PRESETS
    from mpifc.federated.one_pass import record_hyperparameters

    _check_device(device)
    if preset not in PRESETS:
        raise UserError(f"preset={preset!r}: expected one of {', '.join(PRESETS)}")
    learners = {int(k): v for k, v in (client_learners or {}).items()}
    hp = dict(hyperparameters or {})
    if preset == "paper":
        from mpifc.experiments.paper import paper_preset

        table, table_glue = paper_preset(str(shards))
        hp = {**table, **hp}  # explicit settings win
        glue = glue or table_glue
    if clusters is None and preset != "adaptive":
        clusters = 2
    hp = check_hyperparameters(hp, [learner, *learners.values()], flag="hyperparameters")
    if assign == "tree" and servers < 1:
        raise UserError("assign='tree' needs servers >= 1")
    if refine not in (None, "none", "em"):
        raise UserError(f"refine={refine!r}: expected 'none' or 'em'")
    if em_iters is not None and int(em_iters) < 1:
        raise UserError(f"em_iters must be >= 1, got {em_iters}")
    if em_rows is not None and int(em_rows) < 0:
        raise UserError(f"em_rows must be >= 0, got {em_rows}")
    cfg = {"clusters": clusters, "products": products, "glue": glue if glue or preset == "adaptive" else "random", "seed": seed, "learner": learner,
           "client_learners": learners, "hyperparameters": hp, "assign": assign,
           "refine": refine if refine is not None or preset == "adaptive" else "none", "em_iters": em_iters,
           "em_rows": em_rows, "em_leaves": bool(em_leaves), "defaults": "adaptive" if preset == "adaptive" else "learner"}
    from mpifc.federated.learners import takes_device
    from mpifc.fedpc.train import job_learners

    dev = _device(device, any(takes_device(name) for name in job_learners(cfg)))
    m = load_manifest(shards)
    check_outputs([Output("model", model, MODEL_OUTPUT)], input_files(m), source_files(m), overwrite=overwrite)
    resolve_glue_and_refine(cfg, m)
    datas = [read_client_data(shards, c) for c in range(m.n_clients)]
    builder = builder_from_config(cfg)
    plan = builder.plan([d.declaration for d in datas], m.feature_order, m.target, m.setting)
    reports = [released(fit_client(client_plan(plan, c), c, d, device=dev), d.shard) for c, d in enumerate(datas)]
    n_servers = servers if assign == "tree" else 0
    ranks = client_rank_map(range(m.n_clients), n_servers)
    fc = builder.assemble(plan, reports, ranks)
    assign_psi(fc, assign, n_servers)
    insert_models(fc, {(r.client, leaf.subspace, leaf.cluster): leaf.model for r in reports for leaf in r.leaves})
    fc.validate(require_models=True)
    if cfg["refine"] == "em":
        _simulate_em(fc, datas, m.setting, int(cfg["em_iters"]), cfg.get("em_rows"), int(seed), bool(em_leaves))
    record_hyperparameters(fc, plan)
    fc.meta.update(codec=model_codec(m), simulated=True, preset=preset, **{SOURCES: recorded_sources(m)})
    if model is not None:
        save_fc(fc, model)
    return FederatedModel(fc, path=None if model is None else str(Path(model)))
