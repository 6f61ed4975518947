"""mpifc: federated probabilistic circuits on MPI.

Layers, ground up (no import points upward):
  mpifc.circuit    PCs on one machine (no MPI)
  mpifc.federated  the FC as data, Algorithm 1, weight inference (no MPI)
  mpifc.runtime    MPI actors, byte-counted transport, ledger, distributed passes
  mpifc.experiments / baselines / analysis / ngm, then mpifc.cli
"""

__version__ = "0.1.0"
