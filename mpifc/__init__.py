"""mpifc: federated probabilistic circuits on MPI.

    import mpifc
    fc = mpifc.load("fc.h5")              # a trained model, queried in one process (mpifc.api)
    fc = mpifc.simulate("shards/")        # one-pass training in one process, no MPI

Layers, ground up (no import points upward):
  mpifc.circuit    PCs on one machine (no MPI)
  mpifc.federated  the FC as data (psi, omega), Algorithm 1, weight inference (no MPI)
  mpifc.runtime    the generic byte-counted actor runtime: transport, ledger, jobs, deadlines
  mpifc.fedpc      the FedPC protocol over the runtime: training, query passes, MPE, EM, audit
  mpifc.experiments / baselines / analysis / ngm, then mpifc.api (Python) and mpifc.cli
mpifc.errors and mpifc.atomic sit below them all; data_prep stands beside them.
"""

__version__ = "0.1.0"

__all__ = ["FederatedModel", "load", "simulate", "__version__"]


def __getattr__(name: str):
    # The API loads on first use, so ``import mpifc`` (every rank, every CLI call) stays light.
    if name in ("FederatedModel", "load", "simulate"):
        from mpifc import api

        return getattr(api, name)
    raise AttributeError(f"module 'mpifc' has no attribute {name!r}")
