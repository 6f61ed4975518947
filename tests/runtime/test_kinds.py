"""Message-kind registry: ids from names only, collisions caught, payload classes checked."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mpifc.runtime import kinds
from mpifc.runtime.kinds import MAX_KIND_ID, derived_kind_id, kind_by_id, kind_by_name, register_kind
from tests.mpi_util import REPO


def test_register_and_look_up():
    k = register_kind("test.kinds.a", "flow", "flows")
    assert 1 <= k.kind_id <= MAX_KIND_ID and k.tag == k.kind_id
    assert kind_by_name("test.kinds.a") is k and kind_by_id(k.kind_id) is k
    assert register_kind("test.kinds.a", "flow", "again") is k  # idempotent


def test_same_name_other_payload_class_is_refused():
    register_kind("test.kinds.b", "count", "counts")
    with pytest.raises(ValueError, match="already registered"):
        register_kind("test.kinds.b", "flow", "flows")


def test_unknown_payload_class_is_refused():
    with pytest.raises(ValueError, match="unknown payload class 'secrets'"):
        register_kind("test.kinds.c", "secrets", "raw rows")


def test_id_collision_is_an_error_and_explicit_id_resolves_it():
    first = register_kind("test.kinds.d", "control", "d")
    # Find another name with the same derived id (15 bits: a few ten thousand tries at most).
    other = next(f"test.kinds.collide{i}" for i in range(10**6) if derived_kind_id(f"test.kinds.collide{i}") == first.kind_id)
    with pytest.raises(ValueError, match="collides with 'test.kinds.d'"):
        register_kind(other, "control", "x")
    free = next(i for i in range(1, MAX_KIND_ID) if i not in {k.kind_id for k in kinds.all_kinds()})
    assert register_kind(other, "control", "x", kind_id=free).kind_id == free


def test_ids_do_not_depend_on_registration_order():
    # Two fresh interpreters register the same names in opposite orders.
    code = ("import sys; from mpifc.runtime.kinds import register_kind as r; names = ['a.x', 'b.y', 'c.z'];"
            "names = names[::-1] if sys.argv[1] == 'rev' else names;"
            "print(sorted((n, r(n, 'control', '').kind_id) for n in names))")
    outs = [subprocess.run([sys.executable, "-c", code, order], capture_output=True, text=True, cwd=REPO,
                           timeout=60, check=True).stdout for order in ("fwd", "rev")]
    assert outs[0] == outs[1] and outs[0].strip()


def test_unknown_id_and_name_raise_keyerror_naming_them():
    with pytest.raises(KeyError, match="no message kind named 'test.kinds.nope'"):
        kind_by_name("test.kinds.nope")
