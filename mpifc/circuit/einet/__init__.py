"""EiNet client learner: Poon-Domingos / random-tree region graphs compiled to einsum layers.

* :mod:`.region_graph` builds the structure (pure Python),
* :mod:`.leaves` holds the leaf families (Gaussian, discretised Gaussian, categorical, Bernoulli,
  and mixed: per variable Gaussian or categorical, for tabular data),
* :mod:`.layers` the einsum and mixing layers, :mod:`.model` the :class:`EiNet` itself,
* :mod:`.training` batch / online EM, the Table 5 presets and the bits-per-dimension metric.
"""
from mpifc.circuit.einet.model import EiNet, EiNetConfig, EiNetStats
from mpifc.circuit.einet.region_graph import RegionGraph, poon_domingos, random_binary_trees
from mpifc.circuit.einet.training import PRESETS, EMSchedule, bits_per_dim, evaluate, fit_einet, train_em
from mpifc.circuit.io import register_model

register_model("einet", EiNet.load)

__all__ = [
    "EiNet", "EiNetConfig", "EiNetStats", "RegionGraph", "poon_domingos", "random_binary_trees",
    "PRESETS", "EMSchedule", "bits_per_dim", "evaluate", "fit_einet", "train_em",
]
