"""onnxruntime as the benchmarks run it: as a user gets it, and out of the next peer's way.

onnxruntime's default for its intra-op pool is to spin-wait for work between operators and after a
run: that is what makes it fast on models of many small operators (ResNet-18's small export, 2
threads: 0.108 ms spinning, 0.194 ms with ``session.intra_op.allow_spinning=0``). Left unbounded,
the workers keep spinning after a run for longer than 100 ms, so a peer timed right after it found
a core taken (fusiontune 0.205 ms there, 0.160 alone). ``session.intra_op.spin_duration_us`` bounds
the spin after the last piece of work: at 1000 us onnxruntime keeps its default speed (0.113 ms) and
the next peer its own (0.168 ms). Until this module, the benchmarks turned spinning off, which
slowed onnxruntime by up to 1.8x on these models and made the ratios against it that much too high.
"""

from __future__ import annotations

from typing import Any

SPIN_DURATION_US = 1000


def session_options(threads: int) -> Any:
    """``ORT_ENABLE_ALL``, ``threads`` intra-op threads, one inter-op thread, sequential, spinning
    bounded to :data:`SPIN_DURATION_US` after the last piece of work."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.intra_op.spin_duration_us", str(SPIN_DURATION_US))
    return so
