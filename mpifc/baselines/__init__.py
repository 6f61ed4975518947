"""mpifc.baselines: the FL baselines the paper compares FCs with, on mpifc's runtime.

Modules (one reason to change each):
  fedavg    FedAvg with an MLP, horizontal FL (MPI job; ``mpifc baseline fedavg``)
  splitnn   SplitNN with MLPs, vertical FL (MPI job; ``mpifc baseline splitnn``)
  central   centralized references: HistGradientBoosting (the ceiling) and an MLP (no MPI)
  mlp       MLP construction, flat parameter vectors, plain-SGD epochs (pure torch)
  data      shards as (features, labels) tables; accuracy and macro F1
  protocol  message kinds and the ``activation``/``gradient`` payload classes
  report    ledger totals per phase / payload class, result printing, the job wrapper

Their bytes land in the same :class:`~mpifc.runtime.ledger.CommLedger` as FedPC's; the closed
forms they are checked against live in :mod:`mpifc.analysis.commcost`.
"""
