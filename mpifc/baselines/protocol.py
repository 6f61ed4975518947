"""Message kinds of the FedAvg and SplitNN baselines, and their payload classes.

SplitNN's very method is to send cut-layer activations up and their gradients down, so those
travel under payload classes of their own, ``activation`` and ``gradient`` (listed in
:data:`~mpifc.runtime.kinds.PAYLOAD_CLASSES`), and not disguised as FC classes.
"""
from __future__ import annotations

from mpifc.runtime.kinds import register_kind

BASELINE_PAYLOAD_CLASSES: tuple[str, ...] = ("activation", "gradient")

# -- FedAvg ----------------------------------------------------------------------------------------
FEDAVG_DECLARE = register_kind("fedavg.declare", "feature_declaration",
                               "client -> server: feature names and training-row count n_k")
FEDAVG_GLOBAL = register_kind("fedavg.global", "model_parameters",
                              "server -> client: global MLP parameters, flat (M,) float")
FEDAVG_LOCAL = register_kind("fedavg.local", "model_parameters",
                             "client -> server: locally trained MLP parameters, flat (M,) float")

# -- SplitNN ---------------------------------------------------------------------------------------
SPLIT_DECLARE = register_kind("splitnn.declare", "feature_declaration",
                              "client -> server: feature count, row counts, ids digests, whether it holds the target")
SPLIT_PLAN = register_kind("splitnn.plan", "control", "server -> client: which client is the label owner")
SPLIT_ACT = register_kind("splitnn.activation", "activation",
                          "client -> server: cut-layer activations of one batch, (B, F) float")
SPLIT_GRAD = register_kind("splitnn.gradient", "gradient",
                           "server -> client: loss gradient w.r.t. that client's activations, (B, F)")
SPLIT_LOGITS = register_kind("splitnn.logits", "activation",
                             "server -> label owner: top-network logits of one batch, (B, k) float")
SPLIT_LOGIT_GRAD = register_kind("splitnn.logit_grad", "gradient",
                                 "label owner -> server: loss gradient w.r.t. the logits, (B, k) float")
SPLIT_SCORES = register_kind("splitnn.scores", "control",
                             "label owner -> server: test accuracy and F1 (two floats)")
