"""mpifc: federated probabilistic circuits on MPI.

Layers, ground up (no import points upward):
  mpifc.circuit    PCs on one machine (no MPI)
  mpifc.federated  the FC as data (psi, omega), Algorithm 1, weight inference (no MPI)
  mpifc.runtime    the generic byte-counted actor runtime: transport, ledger, jobs, deadlines
  mpifc.fedpc      the FedPC protocol over the runtime: training, query passes, MPE, EM, audit
  mpifc.experiments / baselines / analysis / ngm, then mpifc.cli (the command line)
mpifc.errors and mpifc.atomic sit below them all; data_prep stands beside them.
"""

__version__ = "0.1.0"
