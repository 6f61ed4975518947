"""FedNGM: federated Neural Graphical Models (seed paper ``fedngm``) on the mpifc runtime.

Pure logic, one process, no MPI (testable alone):
  schema          named real/categorical features and their one-hot unit layout
  graph           DependencyGraph: names + symmetric boolean adjacency, no self loops
  graph_recovery  local graph by graphical lasso on one-hot, standardised data; expert graphs
  merge           master merge: intersection of nodes, union of edges; schema merge
  model           the NGM (MLP features -> features) and the graph-constrained path norm (eq. 1)
  training        Adam loop: fit + lam * path norm (+ public-data term, eq. 3)
  inference       any subset given the others, by optimising the unknown inputs
  sampling        graph-ordered sampling (BFS), calibrated on the client's data
  federation      global distillation from client samples (eq. 2), stitching, release rule
  ngr             Neural Graph Revealer variant (eqs. 4-5, without log scaling)
  metrics         MAE/RMSE, AUC/AUPR, micro/macro precision/recall (paper Tables 2-4)
  store           model files: HDF5 (weights, statistics, graph), atomic, no pickle
On the runtime (MPI):
  job             rank 0 = master, other ranks = clients; every step a named, counted kind;
                  audit_client_sends checks the gathered ledger against CLIENT_ALLOWED
  cli             mpifc train/evaluate --model-family ngm on data_prep shards
"""
