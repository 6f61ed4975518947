"""A tiny FedNGM job: ``mpiexec -n C+1 python fedngm_job.py OUT_DIR MIN_CLIENTS``.

Client rank r holds 400 rows of the chain a-b-c-d (seed r); rank 1 also holds an extra feature
``e`` = 2c + noise, which it stitches onto the global model. The master writes summary.json and
every rank's ledger goes to ledger.csv. The master adds 200 public rows (eq. 3).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from mpifc.ngm.job import FedNGMSettings, fedngm_rank, result_summary
from mpifc.ngm.schema import real
from mpifc.ngm.training import TrainConfig
from mpifc.ngm.inference import InferenceSettings
from mpifc.runtime.job import run_job
from tests.ngm.conftest import CHAIN_SCHEMA, chain_data

torch.set_num_threads(1)
OUT = Path(sys.argv[1])
CFG = TrainConfig(epochs=4, batch_size=64, seed=0, calib_rows=100, inference=InferenceSettings(steps=10))
SETTINGS = FedNGMSettings(min_clients=int(sys.argv[2]), hidden=(8, 8), client_config=CFG, global_config=CFG,
                          total_samples=400, stitch_hidden=4)


def main(ctx) -> int:
    if ctx.is_server:
        # The master's public rows (eq. 3), columns in another order than the clients'.
        public = chain_data(200, seed=99)[:, ::-1]
        res = fedngm_rank(ctx, SETTINGS, schema=CHAIN_SCHEMA.subset(CHAIN_SCHEMA.names[::-1]), public=public)
        (OUT / "summary.json").write_text(json.dumps(result_summary(res)))
        return 0
    x = chain_data(400, seed=ctx.rank)
    schema = CHAIN_SCHEMA
    if ctx.rank == 1:
        rng = np.random.default_rng(0)
        x = np.column_stack([x, 2.0 * x[:, 2] + 0.3 * rng.standard_normal(len(x))])
        schema = schema.concat(type(schema)((real("e"),)))
    res = fedngm_rank(ctx, SETTINGS, x, schema)
    if res.stitched_model is not None:
        (OUT / f"stitched_{ctx.rank}.json").write_text(json.dumps(list(res.stitched_model.schema.names)))
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main, min_clients=1, deadline=120.0, ledger_csv=OUT / "ledger.csv"))
