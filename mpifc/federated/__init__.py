"""Federated circuits as data: pure logic, no MPI (testable in one process).

* :mod:`~mpifc.federated.structure` — :class:`FederatedCircuit` (DAG, ψ, ω) and its validation.
* :mod:`~mpifc.federated.one_pass` — Algorithm 1: plan (what clients learn) and assembly (weights
  from counts); glue modes ``random``, ``combinatorial``, ``cooccurrence``.
* :mod:`~mpifc.federated.assign` — ψ strategies ``flat`` and ``tree``.
* :mod:`~mpifc.federated.evaluate` — reference evaluator: likelihoods, marginals, conditionals,
  MPE, sampling.
* :mod:`~mpifc.federated.em` — exact EM on the FC structure (flows).
* :mod:`~mpifc.federated.fcdt` — FC[DT], decision trees averaged at the root.
* :mod:`~mpifc.federated.learners` — learner registry (``learnspn``, ``ratspn``, ``einet``, ``dt``,
  ``factorized``); :mod:`~mpifc.federated.factorized` — the factorised test model.
* :mod:`~mpifc.federated.serialize` — the HDF5 model file (atomic writes);
  :mod:`~mpifc.federated.wire_format` — the compact format a leaf model travels in.
"""
