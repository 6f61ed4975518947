"""A client's view of its shard: read only its own file and turn it into a declaration."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py

from data_prep.shards import ClientShard, Manifest, load_manifest, read_client
from mpifc.errors import UserError
from mpifc.federated.one_pass import ClientDeclaration, ids_digest


@dataclass
class ClientData:
    """One client's training/test rows and the declaration it sends (rows never leave the rank)."""

    shard: ClientShard
    declaration: ClientDeclaration


def declared_meta_types(directory: Path, manifest: Manifest, index: int) -> list[str]:
    """The meta-types the client's own file states (what the client believes), else the manifest's."""
    entry = manifest.clients[index]
    path = Path(directory) / entry["file"]
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("meta_types")
    except OSError as e:
        raise UserError(f"{path}: not a readable HDF5 file ({e})") from None
    if raw is None:
        return manifest.meta_types(entry["features"])
    types = json.loads(raw)
    if len(types) != len(entry["features"]):
        raise UserError(f"{path}: meta_types lists {len(types)} types for {len(entry['features'])} features")
    return [str(t) for t in types]


def read_client_data(directory: str | Path, index: int, manifest: Manifest | None = None) -> ClientData:
    """Read client ``index``'s shard (only its own file) and build its declaration.

    ``manifest``: ``directory``'s manifest, if read already (it is then not read again).

    Raises:
        UserError: a bad shard, or a client with zero training rows (naming it and its file).
    """
    m = load_manifest(directory) if manifest is None else manifest
    shard = read_client(directory, index, manifest=m)
    if shard.x_train.shape[0] == 0:
        raise UserError(f"client {index} ({Path(directory) / m.clients[index]['file']}) has zero training rows")
    meta = declared_meta_types(Path(directory), m, index)
    ks = []
    for f in shard.features:
        k = m.features.get(f, {}).get("n_categories") or 0
        ks.append(int(k))
    decl = ClientDeclaration(index, tuple(shard.features), tuple(meta), tuple(ks), int(shard.x_train.shape[0]),
                             ids_digest(shard.ids_train))
    return ClientData(shard, decl)

