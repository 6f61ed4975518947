"""Region graphs: the structure an EiNet is compiled from.

A region is a set of variables; a partition splits a region (its parent) into two disjoint child
regions whose union is the parent. Regions without partitions are leaf regions. Two builders:

* :func:`poon_domingos` for ``H x W (x C)`` images: regions are axis-aligned rectangles on a grid
  of cut lines, and every rectangle is split at every cut line inside it (Poon & Domingos 2011).
* :func:`random_binary_trees` for tabular data: ``repetitions`` random balanced binary splits of
  a permuted variable list down to ``depth``, sharing only the root (RAT-SPN style).

Variables of an image are numbered row-major over ``(H, W, C)``: pixel ``(r, c)`` channel ``ch``
is variable ``(r * W + c) * C + ch``; all channels of a pixel always stay in the same region.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mpifc.errors import UserError


@dataclass(frozen=True)
class RegionGraph:
    """Regions (sorted variable tuples), partitions ``(parent, left, right)`` and the root id."""

    num_vars: int
    regions: tuple[tuple[int, ...], ...]
    partitions: tuple[tuple[int, int, int], ...]
    root: int

    def leaf_regions(self) -> list[int]:
        """Ids of regions that no partition splits, in id order."""
        parents = {p for p, _, _ in self.partitions}
        return [r for r in range(len(self.regions)) if r not in parents]

    def heights(self) -> np.ndarray:
        """Height of each region: 0 for leaf regions, else 1 + max height of any child."""
        children: dict[int, list[int]] = {}
        for p, left, right in self.partitions:
            children.setdefault(p, []).extend((left, right))
        height = np.full(len(self.regions), -1, dtype=np.int64)
        # Children are strictly smaller than parents, so increasing region size is a valid
        # topological order (no recursion on deep graphs).
        for r in sorted(range(len(self.regions)), key=lambda i: len(self.regions[i])):
            kids = children.get(r)
            height[r] = 0 if not kids else 1 + max(height[c] for c in kids)
        return height

    def partition_layers(self) -> list[list[int]]:
        """Partition ids grouped by the height of their parent region (bottom layer first).

        All children of a layer's partitions lie in lower layers, so layers can be evaluated in
        order; the root is the only region of maximal height, so the last layer is the root's.
        """
        h = self.heights()
        layers: dict[int, list[int]] = {}
        for i, (p, _, _) in enumerate(self.partitions):
            layers.setdefault(int(h[p]), []).append(i)
        return [layers[k] for k in sorted(layers)]

    def validate(self) -> None:
        """Raise ``UserError`` unless the graph is smooth, decomposable and rooted at all vars."""
        if set(self.regions[self.root]) != set(range(self.num_vars)):
            raise UserError("region_graph.root: root region must cover all variables")
        for p, left, right in self.partitions:
            a, b, parent = set(self.regions[left]), set(self.regions[right]), set(self.regions[p])
            if a & b or (a | b) != parent or not a or not b:
                raise UserError(f"region_graph.partitions: partition {(p, left, right)} is not a split")


def _cut_positions(length: int, pieces: Sequence[int], field: str) -> list[int]:
    """Grid lines ``0 < c < length`` for ``pieces`` equal parts each (rounded), plus both ends.

    An axis shorter than ``pieces`` is cut at every pixel (one list serves both axes).
    """
    cuts = {0, length}
    for p in pieces:
        p = int(p)
        if p < 1:
            raise UserError(f"{field}: number of pieces must be >= 1, got {p}")
        p = min(p, length)
        cuts.update(int(round(i * length / p)) for i in range(1, p))
    return sorted(cuts)


def poon_domingos(shape: Sequence[int], pd_num_pieces: Sequence[int], extra_vars: int = 0) -> RegionGraph:
    """Poon-Domingos region graph of an image.

    Args:
        shape: ``(H, W)`` or ``(H, W, C)``.
        pd_num_pieces: number of equal pieces per axis, one entry per cut size, e.g. ``[4]``
            (28x28 -> 7x7-pixel cells) or ``[7]`` (4x4-pixel cells); several entries merge
            their cut lines (as Peharz et al. 2020's ``pd_num_pieces``).
        extra_vars: variables after the pixels (e.g. an image's label column in a shard): they
            form one leaf region, joined to the image's region by the root's only partition.

    Returns:
        The region graph; leaf regions are the cells of the merged cut grid (and the extra
        variables' region).
    """
    if len(shape) not in (2, 3) or any(int(s) < 1 for s in shape):
        raise UserError(f"image_shape: expected (H, W) or (H, W, C) with positive sizes, got {tuple(shape)}")
    if int(extra_vars) < 0:
        raise UserError(f"image_shape: {tuple(shape)} holds {int(np.prod(shape))} variables, more than the "
                        f"{int(np.prod(shape)) + int(extra_vars)} columns given")
    if not pd_num_pieces:
        raise UserError("pd_num_pieces: must list at least one number of pieces")
    height, width = int(shape[0]), int(shape[1])
    channels = int(shape[2]) if len(shape) == 3 else 1
    rows = _cut_positions(height, pd_num_pieces, "pd_num_pieces")
    cols = _cut_positions(width, pd_num_pieces, "pd_num_pieces")

    def variables(r0: int, r1: int, c0: int, c1: int) -> tuple[int, ...]:
        return tuple(
            (r * width + c) * channels + ch
            for r in range(r0, r1) for c in range(c0, c1) for ch in range(channels)
        )

    ids: dict[tuple[int, int, int, int], int] = {}
    regions: list[tuple[int, ...]] = []
    partitions: list[tuple[int, int, int]] = []

    def region_id(rect: tuple[int, int, int, int]) -> int:
        if rect not in ids:
            ids[rect] = len(regions)
            regions.append(variables(*rect))
            queue.append(rect)
        return ids[rect]

    queue: deque[tuple[int, int, int, int]] = deque()
    root = region_id((0, height, 0, width))
    while queue:
        r0, r1, c0, c1 = rect = queue.popleft()
        parent = ids[rect]
        for c in cols:
            if c0 < c < c1:
                partitions.append((parent, region_id((r0, r1, c0, c)), region_id((r0, r1, c, c1))))
        for r in rows:
            if r0 < r < r1:
                partitions.append((parent, region_id((r0, r, c0, c1)), region_id((r, r1, c0, c1))))
    n = height * width * channels
    if extra_vars:
        image = root
        root = len(regions) + 1
        regions += [tuple(range(n, n + int(extra_vars))), tuple(range(n + int(extra_vars)))]
        partitions.append((root, image, root - 1))
        n += int(extra_vars)
    return RegionGraph(n, tuple(regions), tuple(partitions), root)


def random_binary_trees(num_vars: int, depth: int, repetitions: int, seed: int = 0) -> RegionGraph:
    """``repetitions`` random balanced binary region trees over ``num_vars`` sharing the root.

    Args:
        num_vars: number of variables.
        depth: number of split levels; a region with fewer than 2 variables is not split.
        repetitions: number of independently permuted trees (the root gets one partition each).
        seed: seed of the permutations.
    """
    if num_vars < 1:
        raise UserError(f"num_vars: must be >= 1, got {num_vars}")
    if depth < 0:
        raise UserError(f"depth: must be >= 0, got {depth}")
    if repetitions < 1:
        raise UserError(f"repetitions: must be >= 1, got {repetitions}")
    rng = np.random.default_rng(seed)
    regions: list[tuple[int, ...]] = [tuple(range(num_vars))]
    partitions: list[tuple[int, int, int]] = []
    if depth == 0 or num_vars < 2:
        return RegionGraph(num_vars, tuple(regions), (), 0)
    for _ in range(repetitions):
        order = rng.permutation(num_vars)
        # Work queue of (region id, its variables in permuted order, level).
        queue: deque[tuple[int, np.ndarray, int]] = deque([(0, order, 0)])
        while queue:
            parent, vars_, level = queue.popleft()
            if level >= depth or len(vars_) < 2:
                continue
            halves = np.array_split(vars_, 2)
            kids = []
            for half in halves:
                regions.append(tuple(sorted(int(v) for v in half)))
                kids.append(len(regions) - 1)
                queue.append((kids[-1], half, level + 1))
            partitions.append((parent, kids[0], kids[1]))
    return RegionGraph(num_vars, tuple(regions), tuple(partitions), 0)
