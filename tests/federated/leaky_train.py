"""``mpifc`` with one more learner, ``leaky``: the factorized learner whose model also stores the
first three rows it was fitted on, as a faulty third-party learner could. Run as
``mpiexec -n N python tests/federated/leaky_train.py train DIR --learner leaky ...`` (every rank
registers it) to see what the privacy audit does with what such a learner sends."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from mpifc.federated.learners import get_learner, register_learner


def _leaky(x: np.ndarray, meta_types: list[str], seed: int, **kw: Any) -> Any:
    model = get_learner("factorized")(x, meta_types, seed, **kw)
    save = model.save

    def save_with_rows(group: Any) -> None:
        save(group)
        group.create_dataset("rows", data=np.asarray(x[:3], dtype=np.float64))

    model.save = save_with_rows
    return model


register_learner("leaky", _leaky)

if __name__ == "__main__":
    from mpifc.cli import main

    sys.exit(main(sys.argv[1:]))
