"""mpifc.fedpc: the FedPC protocol over mpifc's runtime.

Modules (one reason to change each):
  protocol  the protocol's message kinds and the payload classes a client may send
  data      a client's view of its shard (rows, declared meta-types, declaration)
  train     one-pass training: declarations, plan, local fits, counts, model assembly
  em        exact distributed EM after one-pass training (pooled statistics)
  query     the upward and downward passes, and the evidence the querier sends
  checks    what every rank checks on a model file before a distributed query
  evaluate  test log-likelihood, accuracy and F1 (distributed upward pass or gathered model)
  mpe       distributed MPE and sampling (max-product upward pass, decisions downward)
  audit     the per-rank send audit (privacy: no raw row leaves a client)
  job       the ``train`` and ``evaluate`` jobs every rank runs

It imports :mod:`mpifc.runtime`, :mod:`mpifc.federated`, :mod:`mpifc.circuit` and
:mod:`data_prep`; none of those import it.
"""
