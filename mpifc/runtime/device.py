"""Which torch device a rank computes on: ``cuda:(local_rank % n_gpus)`` or the CPU.

``--device`` takes ``auto`` (the default: this rank's GPU where CUDA is there, else the CPU),
``cpu``, ``cuda`` (this rank's GPU, by local rank) or ``cuda:N``. The value is checked for its
form without torch (:func:`parse_device`); a rank resolves it (:func:`select_device`, which
imports torch) only when it computes on torch, so a rank that computes nothing there never
imports it. An explicit ``cuda``/``cuda:N`` is checked on every rank before the job's work starts
(:func:`device_problem`, called by :func:`mpifc.runtime.job.run_job`).
"""
from __future__ import annotations

import os
import re
from typing import Any

from mpifc.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
_FORM = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def parse_device(value: str | None) -> str:
    """``value`` as a ``--device`` value (``None``/empty: ``"auto"``), checked for its form only.

    Raises:
        UserError: anything but auto, cpu, cuda or cuda:N.
    """
    text = "auto" if value in (None, "") else str(value).strip()
    if not _FORM.match(text):
        raise UserError(f"--device {value!r}: expected {DEVICE_CHOICES}")
    return text


def wants_cuda(value: str | None) -> bool:
    """Whether ``value`` asks for a GPU explicitly (``cuda``/``cuda:N``): such a request is
    checked on every rank before any work."""
    return parse_device(value).startswith("cuda")


LOCAL_RANK_VARIABLES = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),                       # MPICH hydra
                        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))  # Open MPI


def local_rank_of(comm: Any) -> tuple[int, int]:
    """``(local rank, ranks on this node)``: from the launcher's environment where it says, else
    from MPI's shared-memory split (a collective)."""
    import os

    for rank_var, size_var in LOCAL_RANK_VARIABLES:
        r, n = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
        if r.isdigit() and n.isdigit() and int(r) < int(n) and comm.Get_size() > 1:
            return int(r), int(n)
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_problem(local_rank: int, override: str | None) -> str | None:
    """Why ``override`` names no device of this node (one clause), or None when it does."""
    value = parse_device(override)
    if not value.startswith("cuda"):
        return None
    n = _gpu_count()
    if n == 0:
        return "CUDA is not available on this node"
    if ":" in value and int(value.split(":", 1)[1]) >= n:
        return f"this node has {n} CUDA device(s), so the last one is cuda:{n - 1}"
    return None


def select_device(local_rank: int, override: str | None = None) -> Any:
    """The ``torch.device`` for a rank.

    Args:
        local_rank: the rank's index among the ranks on its node.
        override: ``--device`` value: ``"auto"``/``None`` (pick), ``"cpu"``, ``"cuda"`` (this rank's
            GPU by local rank) or ``"cuda:N"``.

    Raises:
        UserError: the override is malformed or names a device that is not there.
    """
    import torch

    value = parse_device(override)
    if value == "cpu":
        return torch.device("cpu")
    n = _gpu_count()
    if value == "auto":
        return torch.device(f"cuda:{local_rank % n}") if n else torch.device("cpu")
    problem = device_problem(local_rank, value)
    if problem:
        raise UserError(f"--device {value!r} on host {_host()}: {problem}")
    index = local_rank % n if value == "cuda" else int(value.split(":", 1)[1])
    return torch.device(f"cuda:{index}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _ram_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def cpu_facts() -> dict[str, Any]:
    """The CPU as a device: name, memory (bytes) and cores, without torch."""
    return {"device": "cpu", "name": _cpu_name(), "memory_bytes": _ram_bytes(), "cores": os.cpu_count(),
            "host": _host()}


def device_facts(device: Any) -> dict[str, Any]:
    """What a rank computed on: ``device``, ``name``, ``memory_bytes`` (total) and ``host``; on a
    GPU also ``peak_bytes`` (the most its tensors held at once, ``torch.cuda.max_memory_allocated``)."""
    name = str(device)
    if not name.startswith("cuda"):
        return cpu_facts()
    import torch

    dev = torch.device(name)
    props = torch.cuda.get_device_properties(dev)
    return {"device": name, "name": props.name, "memory_bytes": int(props.total_memory),
            "peak_bytes": int(torch.cuda.max_memory_allocated(dev)), "host": _host()}


def describe_devices(devices: dict[str, dict[str, Any]] | None) -> str:
    """One line for a summary: ranks grouped by the device they computed on, e.g.
    ``rank 0 cpu; ranks 1-4 cuda:0 NVIDIA H100 (79.1 GiB, peak 2.3 GiB)``."""
    if not devices:
        return ""
    groups: dict[str, list[int]] = {}
    for rank, facts in sorted(devices.items(), key=lambda kv: int(kv[0])):
        label = str(facts.get("device", "?"))
        if label.startswith("cuda"):
            mem = facts.get("memory_bytes")
            label += f" {facts.get('name', '')}" + (f" ({mem / 2**30:.1f} GiB)" if mem else "")
        groups.setdefault(label, []).append(int(rank))
    parts = []
    for label, ranks in groups.items():
        parts.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranges(ranks)} {label}")
    peaks = [f.get("peak_bytes") for f in devices.values() if f.get("peak_bytes") is not None]
    tail = f"; GPU peak per rank up to {max(peaks) / 2**30:.2f} GiB" if peaks else ""
    return "; ".join(parts) + tail


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, start = [], ranks[0]
    for i, prev in enumerate(ranks):
        nxt = ranks[i + 1] if i + 1 < len(ranks) else None
        if nxt is None or nxt != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = nxt
    return ",".join(out)


def _host() -> str:
    """This node's host name (the socket module is imported only when one is asked for)."""
    import socket

    return socket.gethostname()
