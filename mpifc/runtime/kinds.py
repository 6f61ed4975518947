"""Registry of named message kinds.

Every message that crosses between ranks has a *kind*: a dotted name (``"fc.likelihoods"``), a
payload class (what sort of information it carries, used by the privacy audit: client ranks may
send only some classes) and a small integer id that travels in the message header and doubles as
the MPI tag, so interleaved kinds never match each other's receives.

Ids are derived from the name alone (CRC-32 folded into :data:`KIND_ID_BITS` bits), so they are the
same on every rank whatever order modules are imported in. A collision between two names is an
error at registration time (deterministic, so it shows up in any test that imports both modules);
fix it by renaming or by passing an explicit ``kind_id``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

PAYLOAD_CLASSES: tuple[str, ...] = (
    "control",              # protocol steering: shutdown, barrier, round numbers
    "feature_declaration",  # feature names and types a client holds
    "count",                # sample counts (e.g. |D_k|)
    "model_parameters",     # circuit structure and parameters
    "likelihood_vector",    # per-sample log-likelihoods or likelihood sums
    "flow",                 # per-sample flows / EM statistics sent down or up
    "cluster_ids",          # per-sample cluster assignments (vertical FL)
    "evidence",             # query evidence sent by the party asking a query
    "timing",               # wall-clock measurements
    "ledger",               # communication-ledger rows
    "activation",           # per-sample cut-layer activations or logits (SplitNN forward)
    "gradient",             # per-sample gradients w.r.t. those activations (SplitNN backward)
    "query_answer",         # a client's part of the answer to the querier's own MPE/sampling query
)

# 15 bits keep every tag within the MPI standard's guaranteed minimum MPI_TAG_UB (32767).
KIND_ID_BITS = 15
MAX_KIND_ID = (1 << KIND_ID_BITS) - 1


@dataclass(frozen=True)
class MessageKind:
    """One registered message kind.

    Attributes:
        name: dotted name, unique over the registry.
        kind_id: 1..MAX_KIND_ID; also the MPI tag of every message of this kind.
        payload: one of :data:`PAYLOAD_CLASSES`.
        description: one line for the ledger and the audit report.
    """

    name: str
    kind_id: int
    payload: str
    description: str

    @property
    def tag(self) -> int:
        """MPI tag used for the header and payload messages of this kind."""
        return self.kind_id


_BY_NAME: dict[str, MessageKind] = {}
_BY_ID: dict[int, MessageKind] = {}


def derived_kind_id(name: str) -> int:
    """The id a name gets when none is given: CRC-32 folded to 15 bits, never 0."""
    h = zlib.crc32(name.encode("utf-8"))
    kid = (h ^ (h >> KIND_ID_BITS) ^ (h >> (2 * KIND_ID_BITS))) & MAX_KIND_ID
    return kid or 1


def register_kind(name: str, payload: str, description: str, kind_id: int | None = None) -> MessageKind:
    """Register (or look up, if registered identically before) a message kind.

    Args:
        name: dotted name, e.g. ``"fc.upward.likelihoods"``.
        payload: payload class, one of :data:`PAYLOAD_CLASSES`.
        description: one line saying what the message carries.
        kind_id: explicit id (1..32767), only to resolve a hash collision.

    Returns:
        The registered :class:`MessageKind`. Registering the same name twice with the same payload
        class returns the first registration (module reloads are harmless).

    Raises:
        ValueError: unknown payload class, a name re-registered with another payload class, or an
            id that collides with another name.
    """
    if payload not in PAYLOAD_CLASSES:
        raise ValueError(f"message kind {name!r}: unknown payload class {payload!r}; "
                         f"expected one of {', '.join(PAYLOAD_CLASSES)}")
    old = _BY_NAME.get(name)
    if old is not None:
        if old.payload != payload or (kind_id is not None and kind_id != old.kind_id):
            raise ValueError(f"message kind {name!r} already registered with payload {old.payload!r} "
                             f"and id {old.kind_id}")
        return old
    kid = derived_kind_id(name) if kind_id is None else int(kind_id)
    if not 1 <= kid <= MAX_KIND_ID:
        raise ValueError(f"message kind {name!r}: id {kid} outside 1..{MAX_KIND_ID}")
    clash = _BY_ID.get(kid)
    if clash is not None:
        raise ValueError(f"message kind {name!r}: id {kid} collides with {clash.name!r}; "
                         f"rename one of them or pass an explicit kind_id")
    kind = MessageKind(name=name, kind_id=kid, payload=payload, description=description)
    _BY_NAME[name] = kind
    _BY_ID[kid] = kind
    return kind


def kind_by_id(kind_id: int) -> MessageKind:
    """The kind with this id; KeyError naming the id if none is registered on this rank."""
    try:
        return _BY_ID[int(kind_id)]
    except KeyError:
        raise KeyError(f"no message kind with id {kind_id} is registered on this rank "
                       f"(is the module that registers it imported?)") from None


def kind_by_name(name: str) -> MessageKind:
    """The kind with this name; KeyError naming it if not registered."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no message kind named {name!r} is registered") from None


def all_kinds() -> list[MessageKind]:
    """Every registered kind, sorted by name."""
    return sorted(_BY_NAME.values(), key=lambda k: k.name)


def as_kind(kind: MessageKind | str) -> MessageKind:
    """Accept a kind or its name."""
    return kind if isinstance(kind, MessageKind) else kind_by_name(kind)


# Kinds the runtime itself uses.
SHUTDOWN = register_kind("runtime.shutdown", "control", "an actor tells a peer it will send nothing more")
PING = register_kind("runtime.ping", "control", "liveness / demo ping carrying a small array")
ERROR_NOTICE = register_kind("runtime.error", "control", "a rank reports it failed (before aborting)")
