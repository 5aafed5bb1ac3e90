"""Will a workload fit in memory? Its bytes, estimated from shapes, against what the machine has.

A workload holds its inputs and weights, and building it runs the float64 interpreter on the
unfused graph, which keeps every value of the graph alive at once (:func:`run_graph` frees
nothing until it returns), each float promoted to float64. That run is the peak of building a
workload, and it is known from the graph's static shapes before any array exists; a size that
cannot fit is refused then, in one line, instead of failing deep inside numpy after minutes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fusiontune.errors import UserError
from fusiontune.ir.graph import Graph, Value

REFERENCE_DTYPE = np.dtype("float64")


def value_bytes(value: Value, dtype: np.dtype | None = None) -> int:
    """Bytes of ``value`` in its own dtype, or in ``dtype`` when it is a float (the reference's).

    ``math.prod`` of Python ints, not ``Value.nbytes``: a shape from a huge ``--size`` must not
    overflow int64 into a small or negative number.
    """
    own = np.dtype(value.dtype)
    itemsize = dtype.itemsize if dtype is not None and own.kind == "f" else own.itemsize
    return math.prod(int(d) for d in value.shape) * itemsize


def input_bytes(values: Iterable[Value]) -> int:
    """Bytes of graph inputs as the workload holds them plus their float64 copies in the reference."""
    return sum(value_bytes(v) + value_bytes(v, REFERENCE_DTYPE) for v in values)


def workload_bytes(graph: Graph) -> int:
    """The peak bytes of building a workload of ``graph``: inputs and weights in their dtypes, and
    every value of the graph in the float64 reference (which holds them all at once)."""
    held = sum(value_bytes(graph.values[n]) for n in (*graph.inputs, *graph.constants))
    reference = sum(value_bytes(v, REFERENCE_DTYPE) for v in graph.values.values())
    return held + reference


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping: ``MemAvailable`` of
    ``/proc/meminfo`` (else free physical pages), capped by the cgroup v2 limit of a container;
    None when neither can be read."""
    found: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            found = min(found, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return found


def size_text(n: int) -> str:
    """About ``n`` bytes, three significant digits: ``381 GiB``, ``22.8 GiB``, ``7.28 TiB``."""
    value, unit = float(n), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    if unit == "bytes":
        return f"{n} bytes"
    return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"


def check_fits(need: int, what: str, counted: str) -> None:
    """Refuse a workload that needs more memory than the machine has available.

    Args:
        need: the estimated bytes.
        what: who needs them, e.g. ``mlp: batch=100000000``.
        counted: what the estimate counts, e.g. ``inputs, weights and the float64 reference``.

    Raises:
        UserError: ``<what> needs about 381 GiB (<counted>); this machine has 22.8 GiB
            available``. Nothing is checked when the available memory cannot be read.
    """
    have = available_memory()
    if have is not None and need > have:
        raise UserError(
            f"{what} needs about {size_text(need)} ({counted}); this machine has"
            f" {size_text(have)} available"
        )
