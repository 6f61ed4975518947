"""SplitNN over real MPI jobs: equality with the centralized concatenated network, exact ledger
bytes, accuracy, what clients send, and sample alignment."""
from __future__ import annotations

import numpy as np
import torch

from data_prep.shards import load_manifest
from mpifc.analysis.commcost import splitnn_bytes, splitnn_messages, with_headers
from mpifc.baselines.data import client_xy
from mpifc.baselines.mlp import get_flat
from mpifc.baselines.splitnn import SplitNetwork
from tests.baselines.fixtures import json_line, phase_bytes, read_ledger
from tests.mpi_util import run_mpi

JOB = ["-m", "mpifc", "baseline", "splitnn"]


def test_splitnn_equals_concatenated_network_with_exact_bytes(bc_dirs, tmp_path):
    epochs, cut, batch, lr = 2, 8, 32, 0.3
    out, ledger = tmp_path / "params", tmp_path / "ledger.csv"
    r = run_mpi(3, JOB + [str(bc_dirs["v2"]), "--epochs", str(epochs), "--cut", str(cut), "--batch-size", str(batch),
                          "--lr", str(lr), "--save-params", str(out), "--ledger", str(ledger), "--json"], timeout=240)
    assert r.returncode == 0, r.stderr
    res = json_line(r.stdout)
    assert res["accuracy"] >= 0.9 and res["f1"] >= 0.9

    # the same network trained in one process on the joined columns ends where the federation did
    m = load_manifest(bc_dirs["v2"])
    parts = [client_xy(m, c) for c in range(m.n_clients)]
    assert all(np.array_equal(p.ids, parts[0].ids) for p in parts)
    xs = [torch.from_numpy(p.x).float() for p in parts]
    net = SplitNetwork([x.shape[1] for x in xs], 2, cut, (32,), (32,), seed=0, dtype=torch.float32)
    init_top = get_flat(net.top)
    net.train(xs, torch.from_numpy(parts[0].y), epochs, batch, lr, seed=0)
    np.testing.assert_allclose(np.load(out / "top.npy"), get_flat(net.top), atol=1e-5)
    for c, b in enumerate(net.bottoms):
        np.testing.assert_allclose(np.load(out / f"bottom-{c}.npy"), get_flat(b), atol=1e-5)
    assert np.max(np.abs(get_flat(net.top) - init_top)) > 1e-3

    # bytes: per epoch, S rows of F activations up and F gradients down per client, plus the
    # label owner's k logits down and k logit gradients up
    s = res["n_train"]
    rows = read_ledger(ledger)
    payload = phase_bytes(rows, "train")
    assert payload == splitnn_bytes(2, cut, s, epochs, 4, n_classes=2) == epochs * s * (2 * 2 * cut + 2 * 2) * 4
    n_msg = splitnn_messages(2, s, epochs, batch)
    assert sum(1 for x in rows if x["phase"] == "train") == n_msg == epochs * -(-s // batch) * 6
    assert res["bytes_train"] == with_headers(payload, n_msg, ndim=2)

    # clients send declarations, activations and gradients (of the logits, label owner only);
    # every activation message is a batch of F-wide cut-layer rows, never a raw row
    from_clients = [x for x in rows if x["src"] != "0"]
    assert {x["payload_class"] for x in from_clients} <= {"feature_declaration", "activation", "gradient", "control"}
    acts = [x for x in from_clients if x["kind"] == "splitnn.activation" and x["phase"] == "train"]
    assert acts and all(int(x["payload_bytes"]) % (cut * 4) == 0 for x in acts)
    assert {x["src"] for x in from_clients if x["kind"] == "splitnn.logit_grad"} == {str(1 + res["label_owner"])}


def test_splitnn_refuses_unaligned_samples(bc_dirs):
    r = run_mpi(4, JOB + [str(bc_dirs["h3"]), "--epochs", "1"], timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "client 1 (rank 2)" in r.stderr and "sample ids" in r.stderr
