"""FedNGM on data_prep shards: the jobs behind ``mpifc train/evaluate --model-family ngm``.

``mpiexec -n C+1 mpifc train DIR --model-family ngm --model M.h5 [--min-clients k ...]``: rank 0
is the master, client rank ``r`` reads only shard ``r - 1`` (``read_client``); the master reads
only the manifest (feature declarations) and, with ``--public``, a public shard directory's
``test.h5``. The global NGM and its graph go to ``M`` (HDF5, atomically). After the job, rank 0
checks the gathered ledger: client ranks may have sent only the payload classes of
:data:`mpifc.ngm.job.CLIENT_ALLOWED` (graphs, declarations with sizes, model weights).

``mpifc evaluate DIR --model-family ngm --model M.h5 [--target NAME ...] [--client i]``: one
process predicts each target from the other features of the test rows (``test.h5``, or client
``i``'s own test rows) and prints the paper's metrics (see :mod:`mpifc.ngm.metrics`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mpifc.errors import UserError
from mpifc.runtime.jsonout import finite_json
from mpifc.ngm.schema import Feature, Schema, categorical, real


# -- data ----------------------------------------------------------------------------------------
def shard_schema(manifest: Any, names: list[str]) -> Schema:
    """NGM features for shard columns ``names``: columns with declared categories (and the
    target's classes) are categorical, every other one (real, discrete/ordinal, target-encoded)
    real. Prepare shards with ``--encode none`` to keep categoricals as codes.
    """
    feats: list[Feature] = []
    for n in names:
        if n not in manifest.features:
            raise UserError(f"shards {manifest.directory}: column {n!r} is not declared in the manifest")
        k = manifest.features[n].get("n_categories")
        if k:
            feats.append(categorical(n, int(k)))
        else:
            feats.append(real(n))
    return Schema(tuple(feats))


def fold_rows(n: int, folds: int, fold: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train_idx, held_out_idx)`` of ``n`` rows for K-fold cross-validation (held out empty
    when ``fold`` is None). Deterministic in ``seed``, so a client and an evaluator agree."""
    if fold is None:
        return np.arange(n), np.zeros(0, dtype=np.int64)
    if folds < 2 or not 0 <= fold < folds:
        raise UserError(f"--fold must be in 0..--folds-1 with --folds >= 2, got fold {fold} of {folds}")
    perm = np.random.default_rng(seed).permutation(n)
    held = np.sort(np.array_split(perm, folds)[fold])
    return np.setdiff1d(np.arange(n), held), held


# -- train ---------------------------------------------------------------------------------------
def _settings(cfg: dict[str, Any]) -> Any:
    from mpifc.ngm.job import FedNGMSettings
    from mpifc.ngm.training import TrainConfig

    tc = TrainConfig(epochs=cfg["epochs"], batch_size=cfg["batch_size"], lr=cfg["lr"], lam=cfg["lam"],
                     seed=cfg["seed"], calib_rows=cfg["calib_rows"])
    return FedNGMSettings(min_clients=cfg["min_clients"], hidden=tuple(cfg["hidden"]), client_config=tc,
                          global_config=tc, graph_alpha=cfg["graph_alpha"], total_samples=cfg["samples"],
                          proportional=cfg["proportional"], stitch_hidden=cfg["stitch_hidden"])


def _train_job(ctx: Any) -> int:
    from data_prep.shards import load_manifest, read_client, read_test
    from mpifc.ngm.job import fedngm_rank, result_summary
    from mpifc.ngm.store import save_ngm

    cfg = ctx.config
    manifest = load_manifest(cfg["dir"])
    n_clients = len(ctx.roles.clients)
    if n_clients > manifest.n_clients:
        raise UserError(f"{n_clients} client ranks but {cfg['dir']} holds {manifest.n_clients} shards; "
                        f"run with mpiexec -n {manifest.n_clients + 1}")
    settings = _settings(cfg)
    if ctx.is_server:
        public = schema = None
        if cfg.get("public"):
            pub = read_test(cfg["public"])
            schema = shard_schema(load_manifest(cfg["public"]), list(pub.features))
            public = pub.x
        res = fedngm_rank(ctx, settings, schema=schema, public=public)
        extra = {"family": "ngm", "dir": cfg["dir"], "clients": n_clients, "min_clients": cfg["min_clients"],
                 "public": cfg.get("public"), "sample_counts": res.sample_counts, "seed": cfg["seed"]}
        save_ngm(res.global_model, ctx.stage(cfg["model"]), extra)  # in place only if the job succeeds
        cfg["_summary"] = {**result_summary(res), "model": cfg["model"], "clients": n_clients}
        return 0
    index = ctx.rank - 1
    shard = read_client(cfg["dir"], index)
    keep, _ = fold_rows(len(shard.x_train), cfg["folds"], cfg["fold"], cfg["seed"] + index)
    names = list(shard.features)
    if cfg.get("features"):
        lacking = [n for n in cfg["features"] if n not in names]
        if lacking:
            raise UserError(f"client {index} (rank {ctx.rank}): --features {lacking} not in its shard {names}")
        names = list(cfg["features"])
    x = shard.x_train[keep][:, [list(shard.features).index(n) for n in names]]
    res = fedngm_rank(ctx, settings, x, shard_schema(manifest, names))
    if cfg.get("save_local"):
        save_ngm(res.local_model, ctx.stage(Path(cfg["save_local"]) / f"client-{index}.h5"),
                 {"family": "ngm", "client": index, "fold": cfg["fold"], "folds": cfg["folds"]})
        if res.stitched_model is not None:
            save_ngm(res.stitched_model, ctx.stage(Path(cfg["save_local"]) / f"client-{index}-stitched.h5"),
                     {"family": "ngm", "client": index, "stitched": True})
    return 0


def train(cfg: dict[str, Any], *, deadline: float | None = None, ledger: str | None = None,
          as_json: bool = False) -> int:
    """Run FedNGM training as an MPI job; returns the exit code (2 on refusal or bad input).

    Args:
        cfg: ``dir``, ``model``, ``seed``, ``min_clients``, ``lam``, ``epochs``, ``hidden``,
            ``batch_size``, ``lr``, ``calib_rows``, ``samples``, ``proportional``, ``public``,
            ``graph_alpha``, ``stitch_hidden``, ``save_local``, ``folds``, ``fold``, ``features``
            (as :func:`mpifc.cli.train.ngm_train_config` builds them).
        deadline: the job's wall-clock limit in seconds, or None (see :func:`mpifc.runtime.job.run_job`).
        ledger: where rank 0 writes the per-message ledger CSV.
        as_json: rank 0 prints the summary as one JSON line.
    """
    from data_prep.shards import input_files, load_manifest, source_files
    from mpifc.atomic import Output, OutputKind, check_outputs
    from mpifc.federated.serialize import MODEL_OUTPUT, is_model_file
    from mpifc.runtime.job import run_job
    from mpifc.runtime.ledger import LEDGER_OUTPUT

    local_models = OutputKind("an mpifc model", is_model_file, members=r"client-\d+(-stitched)?\.h5")
    inputs = input_files(load_manifest(cfg["dir"]))
    if cfg.get("public"):
        inputs += input_files(load_manifest(cfg["public"]))
    check_outputs([Output("--model", cfg["model"], MODEL_OUTPUT), Output("--ledger", ledger, LEDGER_OUTPUT),
                   Output("--save-local", cfg.get("save_local"), local_models)], inputs,
                  source_files(load_manifest(cfg["dir"])), overwrite=bool(cfg.get("overwrite")))
    if cfg["fold"] is not None:
        fold_rows(cfg["folds"], cfg["folds"], cfg["fold"], 0)  # validates --fold/--folds
    _settings(cfg)  # bad settings fail here, before any rank starts

    def on_ledger(table: Any) -> None:
        from mpifc.ngm.job import audit_client_sends

        audit = audit_client_sends(table)  # raises on a forbidden payload class
        summary = cfg.get("_summary") or {}
        rows = table.rows
        summary["bytes_total"] = int(rows["payload_bytes"].sum() + rows["header_bytes"].sum())
        summary["bytes_by_phase"] = {ph: int(v) for ph, v in _bytes_by_phase(table).items()}
        summary["client_payload_classes"] = audit
        if as_json:
            print(finite_json(summary), flush=True)

    def job(ctx: Any) -> int:
        ctx.config = cfg  # one dict, so on_ledger sees rank 0's summary
        return _train_job(ctx)

    return run_job(job, config=cfg, servers=1, min_clients=1, deadline=deadline,
                   ledger_csv=ledger, on_ledger=on_ledger)


def _bytes_by_phase(table: Any) -> dict[str, int]:
    rows = table.rows
    out: dict[str, int] = {}
    for ph, pb, hb in zip(rows["phase"].tolist(), rows["payload_bytes"].tolist(), rows["header_bytes"].tolist()):
        name = table.phases[ph]
        out[name] = out.get(name, 0) + int(pb + hb)
    return out


# -- evaluate ------------------------------------------------------------------------------------
def evaluate_rows(model: Any, x: np.ndarray, features: list[str], targets: list[str],
                  settings: Any = None) -> list[dict[str, Any]]:
    """Metrics per target on rows ``x`` ``(n, len(features))`` (columns matched by name).

    Returns:
        One record per target: ``target``, ``kind`` (real/binary/multiclass), ``n`` and its metrics.
    """
    from mpifc.ngm.inference import InferenceSettings
    from mpifc.ngm.metrics import evaluate_feature

    missing = [n for n in model.schema.names if n not in features]
    if missing:
        raise UserError(f"evaluation data lacks the model's features {missing}")
    cols = x[:, [features.index(n) for n in model.schema.names]]
    if settings is None and model.calibration is not None:
        c = model.calibration
        settings = InferenceSettings(c.infer_steps, c.infer_lr, c.infer_consistency)
    out = []
    for t in targets:
        f = model.schema[t]
        kind = "real" if not f.is_categorical else ("binary" if f.n_categories == 2 else "multiclass")
        out.append({"target": t, "kind": kind, "n": int(len(cols)),
                    **evaluate_feature(model, cols, t, settings or InferenceSettings())})
    return out


def evaluate(directory: str, model_path: str, targets: list[str], client: int | None = None,
             infer_steps: int | None = None, as_json: bool = False, quiet: bool = False) -> int:
    """Evaluate an NGM model file on shard test rows; prints one line (or JSON) per target.

    Args:
        directory: the shard folder.
        model_path: the FedNGM model file.
        targets: features to predict from the others (empty: the dataset's target).
        client: evaluate on this client's own test rows instead of ``test.h5``.
        infer_steps: input-optimisation steps (``None``: the model's own).
        as_json: print one JSON line instead of one line per target.
        quiet: print nothing.
    """
    from data_prep.shards import load_manifest, read_client, read_test
    from mpifc.ngm.inference import InferenceSettings
    from mpifc.ngm.store import load_ngm

    model, _ = load_ngm(model_path)
    manifest = load_manifest(directory)
    targets = list(targets) or ([manifest.target] if manifest.target else [])
    if not targets:
        raise UserError(f"{directory} has no target column; name one with --target")
    for t in targets:
        if t not in model.schema.names:
            raise UserError(f"--target {t!r}: the model has features {list(model.schema.names)}")
    if client is not None:
        if not 0 <= client < manifest.n_clients:
            raise UserError(f"--client {client}: {directory} has clients 0..{manifest.n_clients - 1}")
        shard = read_client(directory, client)
        x, features, where = shard.x_test, list(shard.features), f"client {client} test rows"
    else:
        test = read_test(directory)
        x, features, where = test.x, list(test.features), "test.h5"
    settings = None
    if infer_steps is not None:
        if infer_steps < 0:
            raise UserError(f"--infer-steps must be >= 0, got {infer_steps}")
        settings = InferenceSettings(steps=infer_steps)
    records = evaluate_rows(model, x, features, targets, settings)
    if quiet:
        return 0
    if as_json:
        print(finite_json({"on": where, "metrics": records}), flush=True)
    else:
        for r in records:
            vals = " ".join(f"{k}={v:.4f}" for k, v in r.items() if isinstance(v, float))
            print(f"{r['target']} ({r['kind']}, {where}, n={r['n']}): {vals}", flush=True)
    return 0
