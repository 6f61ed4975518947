"""Partitioning: pure functions from row positions, labels and feature names to client parts.

Nothing here reads files or values other than labels and match flags, so every split can be
tested in one process. Row sets are positions into the loaded table (the table's ``ids``
turn them into global sample ids); each client's rows come out sorted, so vertical clients
are sample-aligned by construction.

Settings:
    central: one client with every train row and every feature.
    horizontal: rows split (``iid``, ``label``, ``dirichlet`` or ``segment``), all features.
    vertical: every row on every client, features split into disjoint groups (random groups
        for tables, non-overlapping patches for images).
    hybrid: rows split as in horizontal, and features split into a block shared by all
        clients plus one private block per client (tables), or overlapping patches
        (images). Shared features are thus held by several clients on disjoint rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpifc.errors import UserError

SETTINGS = ("central", "horizontal", "vertical", "hybrid")
SPLITS = ("iid", "label", "dirichlet", "segment")
DIRICHLET_DRAWS = 100  # proportion draws tried before a client is declared empty


@dataclass(frozen=True)
class ClientPart:
    """One client's share.

    Attributes:
        train_rows: ``(n_train,)`` int64 table positions, ascending.
        test_rows: ``(n_test,)`` int64 table positions of its held-out rows, ascending.
        features: names of its columns, in column order (target last when held).
        valid_rows: ``(n_valid,)`` int64 table positions of its validation rows (the dataset's
            own validation split, drawn by the same rule as its train rows), ascending; empty
            when the dataset has none.
    """

    train_rows: np.ndarray
    test_rows: np.ndarray
    features: tuple[str, ...]
    valid_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass(frozen=True)
class Partition:
    """All clients' parts plus a JSON-ready description of how they were drawn."""

    setting: str
    clients: tuple[ClientPart, ...]
    info: dict = field(default_factory=dict)


def stage_rng(seed: int, stage: int) -> np.random.Generator:
    """An independent generator per stage, so changing one stage never shifts another."""
    return np.random.default_rng([int(seed), int(stage)])


# --------------------------------------------------------------------------- samples
def split_iid(rows: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Rows shuffled and cut into ``n_clients`` near-equal parts (sizes differ by <= 1)."""
    perm = rng.permutation(np.asarray(rows, dtype=np.int64))
    return [np.sort(part) for part in np.array_split(perm, n_clients)]


def class_owners(n_classes: int, n_clients: int, rng: np.random.Generator
                 ) -> list[list[int]]:
    """Which clients hold each class in a label split.

    With at least as many classes as clients, classes are dealt round-robin in random order
    (each class on one client, each client one or more classes: one digit per client for
    MNIST with 10 clients). With fewer classes, clients are dealt to classes instead, and a
    class's rows are shared by its clients.

    Returns:
        ``owners[c]``: the sorted client indices holding class ``c``.
    """
    owners: list[list[int]] = [[] for _ in range(n_classes)]
    if n_classes >= n_clients:
        for k, c in enumerate(rng.permutation(n_classes)):
            owners[int(c)].append(k % n_clients)
    else:
        classes = rng.permutation(n_classes)
        for i in range(n_clients):
            owners[int(classes[i % n_classes])].append(i)
    return [sorted(o) for o in owners]


def split_by_label(rows: np.ndarray, labels: np.ndarray, owners: list[list[int]],
                   n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's rows go to its owners (split iid among them when several).

    Args:
        rows: ``(m,)`` table positions.
        labels: ``(m,)`` class codes of those rows.
        owners: as from :func:`class_owners`.
    """
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c, who in enumerate(owners):
        class_rows = rows[labels == c]
        for i, chunk in zip(who, split_iid(class_rows, len(who), rng)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]


def dirichlet_proportions(n_classes: int, n_clients: int, alpha: float,
                          rng: np.random.Generator) -> np.ndarray:
    """``(n_classes, n_clients)`` shares, each row drawn from Dirichlet(alpha * 1)."""
    if not alpha > 0:
        raise UserError(f"--alpha must be > 0, got {alpha}")
    return rng.dirichlet(np.full(n_clients, float(alpha)), size=n_classes)


def split_by_proportions(rows: np.ndarray, labels: np.ndarray, props: np.ndarray,
                         rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's rows shuffled and cut by that class's shares; every row used once."""
    n_clients = props.shape[1]
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in range(props.shape[0]):
        class_rows = rng.permutation(rows[labels == c])
        cuts = np.rint(np.cumsum(props[c])[:-1] * class_rows.size).astype(np.int64)
        for i, chunk in enumerate(np.split(class_rows, cuts)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def split_by_weights(rows: np.ndarray, weights: np.ndarray, rng: np.random.Generator
                     ) -> list[np.ndarray]:
    """Each row goes to one client drawn with probability proportional to its weights.

    Args:
        rows: ``(m,)`` table positions.
        weights: ``(m, n_clients)`` non-negative, each row with a positive sum.
    """
    cum = np.cumsum(weights, axis=1)
    cum /= cum[:, -1:]
    u = rng.random(rows.size)[:, None]
    client = np.minimum((u >= cum).sum(axis=1), weights.shape[1] - 1)
    return [np.sort(rows[client == i]) for i in range(weights.shape[1])]


# --------------------------------------------------------------------------- features
def random_feature_groups(features: list[str], n_groups: int, rng: np.random.Generator
                          ) -> list[list[str]]:
    """Features dealt at random into ``n_groups`` disjoint, near-equal, non-empty groups.

    Each group keeps the canonical (input) order of its features.
    """
    if n_groups > len(features):
        raise UserError(f"cannot split {len(features)} features among {n_groups} clients: "
                        "each client needs at least one feature (use fewer --clients)")
    perm = rng.permutation(len(features))
    return [[features[j] for j in sorted(g)] for g in np.array_split(perm, n_groups)]


def grid_shape(n_patches: int, height: int, width: int,
               patches: tuple[int, int] | None = None) -> tuple[int, int]:
    """Grid ``(rows, cols)`` of patches: ``patches`` if given, else the squarest factoring."""
    if patches is not None:
        gr, gc = patches
        if gr * gc != n_patches:
            raise UserError(f"--patches {gr}x{gc} gives {gr * gc} patches for "
                            f"{n_patches} clients")
    else:
        gr = max(d for d in range(1, int(np.sqrt(n_patches)) + 1) if n_patches % d == 0)
        gc = n_patches // gr
    if gr > height or gc > width:
        raise UserError(f"a {gr}x{gc} grid of patches does not fit a {height}x{width} image")
    return gr, gc


def patch_boxes(height: int, width: int, grid: tuple[int, int], overlap: int = 0
                ) -> list[tuple[int, int, int, int]]:
    """Patch boxes ``(r0, r1, c0, c1)`` (half-open), row-major over the grid.

    Without overlap the boxes tile the image; with ``overlap`` each box grows by that many
    pixels into its neighbours (clipped at the border), so neighbours share pixels.
    """
    r_cuts = np.linspace(0, height, grid[0] + 1).round().astype(int)
    c_cuts = np.linspace(0, width, grid[1] + 1).round().astype(int)
    boxes = []
    for a in range(grid[0]):
        for b in range(grid[1]):
            boxes.append((max(0, int(r_cuts[a]) - overlap),
                          min(height, int(r_cuts[a + 1]) + overlap),
                          max(0, int(c_cuts[b]) - overlap),
                          min(width, int(c_cuts[b + 1]) + overlap)))
    return boxes


def box_features(box: tuple[int, int, int, int], width: int, features: list[str]
                 ) -> list[str]:
    """The pixel features inside ``box`` (row-major ``px_r_c`` naming, canonical order)."""
    r0, r1, c0, c1 = box
    return [features[r * width + c] for r in range(r0, r1) for c in range(c0, c1)]


def hybrid_feature_blocks(features: list[str], n_clients: int, n_shared: int | None,
                          rng: np.random.Generator) -> tuple[list[str], list[list[str]]]:
    """A shared block (held by every client) and one private block per client.

    Args:
        features: the non-target features.
        n_shared: size of the shared block; None means a quarter of the features (>= 1).

    Returns:
        ``(shared, private)``; the blocks are disjoint and cover ``features``.
    """
    d = len(features)
    if n_shared is None:
        n_shared = max(1, round(d / 4))
    if n_shared < 1:
        raise UserError(f"--shared-features must be >= 1 in hybrid, got {n_shared}")
    if d - n_shared < n_clients:
        raise UserError(f"hybrid needs a private feature per client: {d} features, "
                        f"{n_shared} shared, {n_clients} clients (lower --shared-features "
                        "or --clients)")
    perm = rng.permutation(d)
    shared = [features[j] for j in sorted(perm[:n_shared])]
    private = [[features[j] for j in sorted(g)]
               for g in np.array_split(perm[n_shared:], n_clients)]
    return shared, private


# --------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class PartitionSpec:
    """How to partition: the command line's partitioning flags.

    Attributes:
        setting: one of ``SETTINGS``.
        n_clients: number of clients (1 for central).
        seed: base seed; each stage draws from its own ``stage_rng``.
        split: sample split for horizontal and hybrid, one of ``SPLITS``.
        alpha: Dirichlet concentration for ``split="dirichlet"``.
        label_owner: client index holding the target, ``"all"``, or None for the setting's
            default (vertical: 0; others: all).
        shared_features: hybrid tables: size of the shared feature block.
        patches: images: grid ``(rows, cols)`` of patches; default squarest.
        overlap: hybrid images: pixels by which patches grow into their neighbours.
    """

    setting: str
    n_clients: int
    seed: int = 0
    split: str = "iid"
    alpha: float = 0.5
    label_owner: int | str | None = None
    shared_features: int | None = None
    patches: tuple[int, int] | None = None
    overlap: int = 2

    def resolved_label_owner(self) -> int | str:
        """The label owner after applying the setting's default."""
        if self.setting == "vertical":
            return 0 if self.label_owner is None else self.label_owner
        if self.setting == "hybrid":
            return "all" if self.label_owner is None else self.label_owner
        return "all"


def _check_spec(spec: PartitionSpec, has_labels: bool, has_segments: bool) -> None:
    if spec.setting not in SETTINGS:
        raise UserError(f"--setting must be one of {', '.join(SETTINGS)}, not {spec.setting!r}")
    if spec.split not in SPLITS:
        raise UserError(f"--split must be one of {', '.join(SPLITS)}, not {spec.split!r}")
    if spec.n_clients < 1:
        raise UserError(f"--clients must be >= 1, got {spec.n_clients}")
    if spec.setting == "central" and spec.n_clients != 1:
        raise UserError(f"--setting central has exactly one client, not {spec.n_clients}")
    if spec.setting in ("vertical", "hybrid") and spec.n_clients < 2:
        raise UserError(f"--setting {spec.setting} needs --clients >= 2")
    if spec.split in ("label", "dirichlet") and spec.setting in ("horizontal", "hybrid") \
            and not has_labels:
        raise UserError(f"--split {spec.split} needs a dataset with a target")
    if spec.split == "segment" and spec.setting in ("horizontal", "hybrid") and not has_segments:
        raise UserError("--split segment needs one --segment predicate per client")
    if spec.setting in ("central", "vertical") and spec.split != "iid":
        raise UserError(f"--split {spec.split} splits samples, which --setting "
                        f"{spec.setting} does not do (use horizontal or hybrid)")
    if spec.setting in ("central", "horizontal") and spec.label_owner not in (None, "all"):
        raise UserError(f"--label-owner applies to vertical and hybrid settings; in "
                        f"{spec.setting} every client holds the label")
    owner = spec.resolved_label_owner()
    if owner != "all" and not (isinstance(owner, int) and 0 <= owner < spec.n_clients):
        raise UserError(f"--label-owner must be 'all' or a client index 0..{spec.n_clients - 1}, "
                        f"not {owner!r}")
    if spec.overlap < 0:
        raise UserError(f"--overlap must be >= 0, got {spec.overlap}")


def split_samples(spec: PartitionSpec, train_rows: np.ndarray, test_rows: np.ndarray,
                  labels: np.ndarray | None, weights: np.ndarray | None,
                  valid_rows: np.ndarray | None = None
                  ) -> tuple[list[np.ndarray], list[np.ndarray], dict, list[np.ndarray]]:
    """Train, test and validation rows split among clients by ``spec.split``.

    The test and validation rows follow the same rule as the train rows (same class owners,
    same Dirichlet shares, same segment weights), so a client's held-out rows look like its
    train rows. Each kind of row draws from its own generator: adding validation rows never
    moves a train or test row.

    Args:
        labels: ``(n_rows,)`` class codes by table position, or None.
        weights: ``(n_rows, n_clients)`` segment weights by table position, or None.
        valid_rows: table positions of the validation rows, or None (none).

    Returns:
        ``(train_parts, test_parts, info, valid_parts)``.
    """
    n = spec.n_clients
    r_train, r_test, r_valid = stage_rng(spec.seed, 1), stage_rng(spec.seed, 2), stage_rng(spec.seed, 9)
    valid = np.empty(0, np.int64) if valid_rows is None else valid_rows
    info: dict = {}
    if spec.split == "iid":
        return (split_iid(train_rows, n, r_train), split_iid(test_rows, n, r_test), info,
                split_iid(valid, n, r_valid))
    if spec.split == "segment":
        return (split_by_weights(train_rows, weights[train_rows], r_train),
                split_by_weights(test_rows, weights[test_rows], r_test), info,
                split_by_weights(valid, weights[valid], r_valid))
    n_classes = int(labels.max()) + 1
    if spec.split == "label":
        owners = class_owners(n_classes, n, stage_rng(spec.seed, 4))
        info["class_owners"] = owners
        return (split_by_label(train_rows, labels[train_rows], owners, n, r_train),
                split_by_label(test_rows, labels[test_rows], owners, n, r_test), info,
                split_by_label(valid, labels[valid], owners, n, r_valid))
    # Small alphas often leave a client empty; redraw (deterministically) as is customary,
    # and give up with the usual empty-client error after DIRICHLET_DRAWS draws.
    r_props = stage_rng(spec.seed, 5)
    for draw in range(1, DIRICHLET_DRAWS + 1):
        props = dirichlet_proportions(n_classes, n, spec.alpha, r_props)
        train_parts = split_by_proportions(train_rows, labels[train_rows], props, r_train)
        if all(p.size for p in train_parts):
            break
    info["dirichlet_proportions"] = np.round(props, 6).tolist()
    info["dirichlet_draws"] = draw
    return (train_parts, split_by_proportions(test_rows, labels[test_rows], props, r_test), info,
            split_by_proportions(valid, labels[valid], props, r_valid))


def split_feature_sets(spec: PartitionSpec, features: list[str],
                       image_shape: tuple[int, int] | None) -> tuple[list[list[str]], dict]:
    """Each client's non-target features for vertical and hybrid settings."""
    n = spec.n_clients
    rng = stage_rng(spec.seed, 3)
    if image_shape is not None:
        h, w = image_shape
        overlap = spec.overlap if spec.setting == "hybrid" else 0
        boxes = patch_boxes(h, w, grid_shape(n, h, w, spec.patches), overlap)
        info = {"patches": [{"rows": [b[0], b[1]], "cols": [b[2], b[3]]} for b in boxes],
                "overlap": overlap}
        return [box_features(b, w, features) for b in boxes], info
    if spec.setting == "vertical":
        return random_feature_groups(features, n, rng), {}
    shared, private = hybrid_feature_blocks(features, n, spec.shared_features, rng)
    rank = {name: j for j, name in enumerate(features)}
    return ([sorted(shared + p, key=rank.__getitem__) for p in private],
            {"shared_features": shared})


def make_partition(spec: PartitionSpec, train_rows: np.ndarray, test_rows: np.ndarray,
                   features: list[str], target: str | None, labels: np.ndarray | None = None,
                   image_shape: tuple[int, int] | None = None,
                   segment_weights: np.ndarray | None = None,
                   valid_rows: np.ndarray | None = None) -> Partition:
    """Partition a table's rows and features among clients.

    Args:
        spec: the partitioning flags.
        train_rows, test_rows: disjoint table positions of the train and test rows.
        features: non-target feature names, canonical order.
        target: the target's name (appended to the label owners' features), or None.
        labels: ``(n_rows,)`` class codes by table position (needed by label/dirichlet).
        image_shape: ``(h, w)`` when the features are ``px_r_c`` pixels (patch splits).
        segment_weights: ``(n_rows, n_clients)`` for ``split="segment"``.
        valid_rows: table positions of the dataset's own validation rows (disjoint from the
            train and test rows), or None; split among clients as the train rows are (central
            and vertical: every client holds all of them).

    Raises:
        UserError: inconsistent flags, or a client left without train rows or features.
    """
    _check_spec(spec, labels is not None, segment_weights is not None)
    if spec.patches is not None and image_shape is None:
        raise UserError("--patches applies to image datasets only")
    if spec.shared_features is not None and (image_shape is not None
                                             or spec.setting != "hybrid"):
        raise UserError("--shared-features applies to hybrid splits of tables only")
    train_rows = np.sort(np.asarray(train_rows, dtype=np.int64))
    test_rows = np.sort(np.asarray(test_rows, dtype=np.int64))
    valid = np.sort(np.asarray([] if valid_rows is None else valid_rows, dtype=np.int64))
    n = spec.n_clients
    info: dict = {}
    if spec.setting in ("central", "vertical"):
        train_parts, test_parts, valid_parts = [train_rows] * n, [test_rows] * n, [valid] * n
    else:
        train_parts, test_parts, info, valid_parts = split_samples(
            spec, train_rows, test_rows, labels, segment_weights, valid)
    if spec.setting in ("central", "horizontal"):
        feature_sets = [list(features)] * n
    else:
        feature_sets, f_info = split_feature_sets(spec, features, image_shape)
        info.update(f_info)
    owner = spec.resolved_label_owner()
    clients = []
    for i in range(n):
        feats = list(feature_sets[i])
        if target is not None and (owner == "all" or owner == i):
            feats.append(target)
        if train_parts[i].size == 0:
            raise UserError(f"client {i} would get no training rows with --setting "
                            f"{spec.setting} --split {spec.split} ({train_rows.size} train "
                            f"rows, {n} clients): use fewer --clients or another split")
        if not feats:
            raise UserError(f"client {i} would get no features")
        clients.append(ClientPart(train_parts[i], test_parts[i], tuple(feats), valid_parts[i]))
    info["label_owner"] = owner
    return Partition(spec.setting, tuple(clients), info)
