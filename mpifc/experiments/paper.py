"""The FC paper's reported numbers and hyperparameters, transcribed once (mean, std).

Dataset keys are data_prep names: ``breast-cancer`` (paper: Cancer), ``adult`` (Income),
``credit`` (Give Me Some Credit), ``mnist``.
"""
from __future__ import annotations

PAPER_NAMES = {"breast-cancer": "Cancer", "adult": "Income", "credit": "Credit", "mnist": "MNIST"}

# Table 1: test log-likelihood and relative runtime (centralized = 1.0).
TABLE1_LL: dict[str, dict[str, tuple[float, float]]] = {
    "mnist": {"central": (3352, 3.5), "horizontal": (3350, 3.2), "vertical": (3351, 3.8), "hybrid": (3349, 3.7)},
    "adult": {"central": (-11.5, 0.1), "horizontal": (-11.4, 3.5), "vertical": (-11.9, 3.3), "hybrid": (-12.0, 1.5)},
    "breast-cancer": {"central": (-38.9, 0.3), "horizontal": (-38.5, 1.1), "vertical": (-38.6, 0.5),
                      "hybrid": (-38.7, 1.5)},
    "credit": {"central": (-12.8, 1.0), "horizontal": (-13.1, 0.5), "vertical": (-12.5, 2.3), "hybrid": (-12.5, 1.3)},
}
TABLE1_RUNTIME: dict[str, dict[str, tuple[float, float]]] = {
    "mnist": {"horizontal": (0.07, 0.01), "vertical": (0.13, 0.01), "hybrid": (0.13, 0.02)},
    "adult": {"horizontal": (0.17, 0.02), "vertical": (0.236, 0.01), "hybrid": (0.21, 0.02)},
    "breast-cancer": {"horizontal": (0.21, 0.07), "vertical": (0.35, 0.05), "hybrid": (0.35, 0.1)},
    "credit": {"horizontal": (0.42, 0.05), "vertical": (0.31, 0.09), "hybrid": (0.40, 0.13)},
}
# Table 1's client counts (section 4: less training time, the same joint distribution).
TABLE1_CLIENTS = {"horizontal": 5, "vertical": 2, "hybrid": 2}

# Table 4 (appendix E.3): LearnSPN threshold, min_instances_slice and glue per setting. The
# extracted table is misaligned (the fourth row carries a glue but sits under "horizontal"); the
# reading here is three rows per setting, horizontal without glue, vertical/hybrid combinatorial.
TABLE4: dict[str, dict[str, tuple[float, int, str]]] = {
    "horizontal": {"adult": (0.3, 200, "random"), "credit": (0.5, 200, "random"),
                   "breast-cancer": (0.4, 300, "random")},
    "vertical": {"adult": (0.4, 100, "combinatorial"), "credit": (0.5, 50, "combinatorial"),
                 "breast-cancer": (0.4, 300, "combinatorial")},
    "hybrid": {"adult": (0.4, 100, "combinatorial"), "credit": (0.5, 50, "combinatorial"),
               "breast-cancer": (0.4, 300, "combinatorial")},
}

# The paper learned its client PCs with SPFlow's LearnSPN (Table 4's parameters are SPFlow's).
# SPFlow 1.1.0's RDC uses 20 random features per column and ranks ties in row order (scipy
# rankdata "ordinal" in its empirical copula), which reports dependence between discrete or
# binary columns that a tie-respecting ("max") copula does not (two independent Bernoulli(0.05)
# columns: RDC 0.956 against 0.003). At Credit's threshold 0.5 a "max" RDC leaves the rare binary
# label in a factor of its own (p(y | x) = p(y): the majority class, macro F1 0.48); SPFlow's
# convention keeps it with the features. Every LearnSPN of table1/table7 (federated clients and
# the centralized reference alike) uses SPFlow's convention, to replicate the paper's learner.
SPFLOW_RDC: dict[str, object] = {"rdc_ties": "ordinal", "rdc_k": 20}


def learnspn_hp(setting: str, dataset: str) -> tuple[dict[str, object], str]:
    """(LearnSPN hyperparameters, glue) of a tabular cell: Table 4 plus SPFlow's RDC convention."""
    thr, mis, glue = TABLE4[setting][dataset]
    return {"threshold": thr, "min_instances_slice": mis, **SPFLOW_RDC}, glue


# FC[DT]'s K for Table 7 (Table 4 states no K; the paper's Fig. 2 has 2). FC[PC] cells are
# trained with mpifc train's adaptive defaults (mpifc.experiments.table7.FC_PC_NOTE).
T7_DEFAULT_CLUSTERS = 2


def paper_preset(directory: str) -> tuple[dict[str, object], str]:
    """(LearnSPN hyperparameters, glue) of ``mpifc train --preset paper``: Table 4 of the paper for
    the shard folder's dataset and setting (:func:`learnspn_hp`, SPFlow's RDC convention included,
    as the experiments use them). UserError where Table 4 has no such cell."""
    from data_prep.shards import load_manifest
    from mpifc.errors import UserError

    m = load_manifest(directory)
    known = sorted({ds for cells in TABLE4.values() for ds in cells})
    if m.setting not in TABLE4 or m.dataset not in TABLE4[m.setting]:
        raise UserError(f"--preset paper: Table 4 has no settings for dataset {m.dataset!r} in the "
                        f"{m.setting} setting ({directory}); it covers {', '.join(known)} in "
                        f"{', '.join(TABLE4)} settings")
    return learnspn_hp(m.setting, m.dataset)


# Table 7 (appendix F): (accuracy, F1) per method, setting, clients and dataset.
_T7_DATASETS = ("breast-cancer", "credit", "adult")


def _row(*vals: float) -> dict[str, dict[str, tuple[float, float]]]:
    # vals: acc, acc_sd, f1, f1_sd for Cancer, Credit, Income in that order (the paper's columns).
    out = {}
    for i, ds in enumerate(_T7_DATASETS):
        a, asd, f, fsd = vals[4 * i:4 * i + 4]
        out[ds] = {"accuracy": (a, asd), "f1": (f, fsd)}
    return out


TABLE7: dict[tuple[str, str, int], dict[str, dict[str, tuple[float, float]]]] = {
    ("horizontal", "fedavg", 5): _row(.92, .03, .92, .03, .71, .11, .48, .04, .68, .06, .51, .03),
    ("horizontal", "fedavg", 10): _row(.92, .04, .91, .05, .56, .12, .47, .06, .64, .06, .52, .03),
    ("horizontal", "fedtree", 5): _row(.93, .01, .92, .01, .91, .01, .63, .01, .88, .01, .82, .02),
    ("horizontal", "fedtree", 10): _row(.94, .01, .93, .01, .92, .01, .69, .01, .87, .01, .80, .01),
    ("horizontal", "fc-pc", 5): _row(.98, .01, .98, .01, .93, .02, .68, .02, .87, .02, .80, .01),
    ("horizontal", "fc-pc", 10): _row(.95, .02, .95, .02, .93, .01, .66, .02, .87, .01, .80, .02),
    ("horizontal", "fc-dt", 5): _row(.95, .03, .93, .02, .92, .01, .67, .01, .89, .01, .83, .01),
    ("horizontal", "fc-dt", 10): _row(.95, .02, .93, .03, .92, .01, .97, .02, .89, .01, .83, .02),
    ("vertical", "splitnn", 2): _row(.98, .01, .98, .01, .93, .01, .48, .01, .56, .25, .42, .17),
    ("vertical", "splitnn", 3): _row(.98, .01, .98, .01, .93, .01, .48, .01, .62, .20, .56, .16),
    ("vertical", "fedtree", 2): _row(.94, .01, .93, .01, .92, .01, .69, .02, .87, .01, .80, .01),
    ("vertical", "fedtree", 3): _row(.93, .01, .92, .01, .92, .01, .69, .01, .87, .01, .80, .01),
    ("vertical", "fc-pc", 2): _row(.96, .01, .96, .01, .92, .01, .67, .01, .84, .02, .74, .01),
    ("vertical", "fc-pc", 3): _row(.95, .01, .95, .01, .92, .01, .66, .02, .84, .01, .74, .01),
    ("vertical", "fc-dt", 2): _row(.96, .01, .96, .02, .93, .01, .60, .02, .83, .02, .67, .02),
    ("vertical", "fc-dt", 3): _row(.95, .01, .95, .03, .93, .01, .60, .02, .82, .02, .67, .02),
    ("hybrid", "fc-pc", 2): _row(.94, .01, .94, .01, .92, .01, .67, .01, .82, .02, .71, .01),
    ("hybrid", "fc-pc", 3): _row(.94, .01, .94, .01, .92, .01, .67, .02, .80, .01, .70, .01),
    ("hybrid", "fc-dt", 2): _row(.96, .01, .96, .02, .93, .01, .60, .02, .82, .02, .66, .02),
    ("hybrid", "fc-dt", 3): _row(.96, .01, .96, .01, .93, .01, .54, .02, .82, .02, .66, .02),
}


def table7_paper(setting: str, method: str, clients: int, dataset: str, metric: str) -> tuple[float, float] | None:
    """The paper's Table 7 value, or ``None`` where the paper has none ("-" or not reported)."""
    return TABLE7.get((setting, method, clients), {}).get(dataset, {}).get(metric)


IMAGE_SETS = ("mnist", "imagenet32", "image-folder")
"""Dataset names (before any ``:K`` suffix) that are image sets: table2's EiNet data, skipped by
the tabular experiments (table1 runs MNIST itself)."""


def is_image_set(dataset: str) -> bool:
    """Whether ``dataset`` (e.g. ``"imagenet32:4"``) names an image set (:data:`IMAGE_SETS`)."""
    return dataset.partition(":")[0] in IMAGE_SETS
