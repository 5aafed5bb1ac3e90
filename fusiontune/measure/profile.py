"""Where a program's time goes: every kernel timed in place, its kind, and its share of the roofline.

:func:`profile_program` times each kernel of a built program on its own, inside the program's own
sequence: a round calls kernel 0, 1, ..., n-1 in order over the program's real buffers (each reads
what the kernels before it just wrote, as in a run), then the whole program once; every round
goes the same way (:func:`~fusiontune.measure.interleaved_timings` with ``rotate=False``), so a
busy moment costs every kernel and the program alike. A sample is about a millisecond of
back-to-back calls (of one kernel, or of the whole program), as ``run`` and the benchmarks time a
program: each kernel is timed in the steady state of a program run in a loop, its worker threads
awake. (One call per sample, ``min_sample_s=0``, puts the measurement's own bookkeeping between
kernels: on a loaded machine numba's idle OpenMP workers fall asleep in it and a parallel kernel
then pays their wake-up, milliseconds, which a program run back to back never does.) The sum of
the kernels' medians is comparable with the program's median; their difference, over the kernel
count, is the per-call overhead of the program's Python loop (and what a kernel called alone
gains from finding its inputs in cache).

Each kernel gets a kind from what its code generator and its nodes are (:func:`kernel_kind`) and
two roofline figures: the least time its bytes take at the measured memory bandwidth
(:func:`~fusiontune.measure.measure_copy_bandwidth`) and the least time its flops take at the
measured float32 peak (:func:`~fusiontune.measure.roofline.measure_peak_flops`), each as a
percentage of its median (:func:`~fusiontune.measure.percent_of_bound`); the larger of the two
bounds is the one that applies. The bandwidth is that of main memory (a copy far larger than the
caches): a kernel whose data stays in cache can pass 100% of it, which says so. :func:`format_profile` prints the table ``fusiontune run
--profile`` shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fusiontune.measure.interleaved import MIN_SAMPLE_S, interleaved_timings
from fusiontune.measure.noise import format_seconds, is_noisy
from fusiontune.measure.roofline import percent_of_bound
from fusiontune.measure.timing import MeasureConfig

if TYPE_CHECKING:
    from fusiontune.ir.graph import Graph
    from fusiontune.runtime import KernelInfo, Program

PROFILE_ROUNDS = 11
"""Rounds of a profile: one sample per kernel per round (the median's 95% CI: ranks 2 to 10)."""

KINDS = ("matmul", "conv", "attention", "reduction", "elementwise", "layout", "pool")
"""The kinds of kernel a profile names (:func:`kernel_kind`), in the order a breakdown lists them."""


def kernel_kind(info: KernelInfo, graph: Graph) -> str:
    """The kind of one kernel, from its code generator and the ops of its nodes.

    ``matmul`` (a MatMul, and its fused epilogue), ``conv`` (Conv, ConvTranspose), ``attention``
    (a fused attention), ``reduction`` (a loop nest with a reduction or normalization in it),
    ``elementwise`` (a loop nest of elementwise ops, a rotary embedding), ``layout`` (copies and
    index ops: Reshape, Transpose, Concat, Gather, ...) and ``pool`` (MaxPool, AveragePool).

    Args:
        info: the kernel's record (``Program.kernels``).
        graph: the program's graph (``Program.graph``), whose nodes the record names.

    Returns:
        One of :data:`KINDS`; the generator's own kind for one this function does not know.
    """
    from fusiontune.ir.ops import CATALOGUE

    ops = [graph.node(n).op for n in info.nodes]
    if info.kind == "conv" or (info.kind == "contraction" and "ConvTranspose" in ops):
        return "conv"
    if info.kind == "contraction":
        return "matmul"
    if info.kind == "window":
        return "pool"
    if info.kind in ("attention", "layout"):
        return info.kind
    if info.kind == "rotary":
        return "elementwise"
    if info.kind == "loop":
        kinds = {CATALOGUE[op].kind for op in ops if op in CATALOGUE}
        return "reduction" if "reduction" in kinds else "elementwise"
    return info.kind


@dataclass(frozen=True)
class KernelProfile:
    """One kernel of a profile.

    Attributes:
        name: the kernel's group name (``Program.kernels[i].group``).
        index: its place in the program's execution order.
        kind: :func:`kernel_kind`.
        template: the code generator that wrote it (loop, contraction, conv, layout, ...).
        nodes: how many graph nodes it runs.
        median_s: median seconds per call.
        iqr_s: interquartile range of the samples.
        noisy: its samples spread wider than the noise limits (``MeasureConfig.max_cv``, ``max_iqr``).
        bytes_moved: the least bytes it must read and write.
        flops: its floating-point operations (approximate for loop nests).
        memory_s: ``bytes_moved / bandwidth``: the least time its traffic takes.
        compute_s: ``flops / peak_flops``: the least time its arithmetic takes.
    """

    name: str
    index: int
    kind: str
    template: str
    nodes: int
    median_s: float
    iqr_s: float
    noisy: bool
    bytes_moved: int
    flops: int
    memory_s: float
    compute_s: float

    @property
    def bound(self) -> str:
        """Which roof applies: ``memory`` or ``compute`` (the larger least time)."""
        return "compute" if self.compute_s > self.memory_s else "memory"

    @property
    def pct_bandwidth(self) -> float:
        """The memory bound as a percentage of the median (100: at the bandwidth roof)."""
        return percent_of_bound(self.median_s, self.memory_s)

    @property
    def pct_peak(self) -> float:
        """The compute bound as a percentage of the median (100: at the FLOP peak)."""
        return percent_of_bound(self.median_s, self.compute_s)

    @property
    def pct_roofline(self) -> float:
        """The applicable bound (the larger) as a percentage of the median."""
        return percent_of_bound(self.median_s, max(self.memory_s, self.compute_s))


@dataclass(frozen=True)
class ProfileReport:
    """A program's time, kernel by kernel.

    Attributes:
        kernels: one row per kernel, slowest first (ties in execution order).
        program_median_s: the whole program's median, timed in the same rounds.
        program_iqr_s: its interquartile range.
        rounds: samples per kernel.
        calls_per_sample: per kernel in execution order, the calls one sample timed.
        bandwidth: the memory bandwidth of the roofline, bytes/s.
        peak_flops: the float32 peak of the roofline, flop/s.
        threads: numba threads the kernels and the peak ran on.
    """

    kernels: tuple[KernelProfile, ...]
    program_median_s: float
    program_iqr_s: float
    rounds: int
    calls_per_sample: tuple[int, ...]
    bandwidth: float
    peak_flops: float
    threads: int

    @property
    def kernel_sum_s(self) -> float:
        """The sum of the kernels' medians."""
        return math.fsum(k.median_s for k in self.kernels)

    @property
    def overhead_s(self) -> float:
        """The program's median less the sum of its kernels' medians (the per-call overhead)."""
        return self.program_median_s - self.kernel_sum_s

    @property
    def overhead_per_kernel_s(self) -> float:
        """:attr:`overhead_s` over the kernel count (NaN without kernels)."""
        return self.overhead_s / len(self.kernels) if self.kernels else math.nan

    def share(self, kernel: KernelProfile) -> float:
        """``kernel``'s median as a fraction of the sum of the kernels' medians."""
        total = self.kernel_sum_s
        return kernel.median_s / total if total > 0 else math.nan

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """Per kind: (kernels, summed median seconds), largest time first."""
        out: dict[str, list[float]] = {}
        for k in self.kernels:
            row = out.setdefault(k.kind, [0, 0.0])
            row[0] += 1
            row[1] += k.median_s
        ranked = sorted(out.items(), key=lambda kv: (-kv[1][1], kv[0]))
        return {kind: (int(n), float(s)) for kind, (n, s) in ranked}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kernels"] = [asdict(k) for k in self.kernels]
        d["calls_per_sample"] = list(self.calls_per_sample)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ProfileReport:
        return ProfileReport(
            kernels=tuple(KernelProfile(**k) for k in d["kernels"]),
            program_median_s=float(d["program_median_s"]),
            program_iqr_s=float(d["program_iqr_s"]),
            rounds=int(d["rounds"]),
            calls_per_sample=tuple(int(n) for n in d["calls_per_sample"]),
            bandwidth=float(d["bandwidth"]),
            peak_flops=float(d["peak_flops"]),
            threads=int(d["threads"]),
        )


def profile_program(
    program: Program,
    inputs: Mapping[str, np.ndarray],
    rounds: int = PROFILE_ROUNDS,
    measure: MeasureConfig | None = None,
    min_sample_s: float = MIN_SAMPLE_S,
    bandwidth: float | None = None,
    peak_flops: float | None = None,
) -> ProfileReport:
    """Time every kernel of ``program`` in place, and the whole program, in the same rounds.

    Exactly these calls happen (:func:`~fusiontune.measure.interleaved_timings`, ``rotate=False``):
    ``inputs`` are bound and the program runs once; then, in execution order, each kernel gets
    ``max(1, measure.warmup)`` untimed calls and one calibration call, and the program the same;
    then ``rounds`` rounds, each timing every kernel in execution order (one sample of its calls
    each) and then the whole program. One attempt: a kernel whose samples spread too wide
    is marked ``noisy``, not measured again.

    Args:
        program: a built program.
        inputs: its inputs by name.
        rounds: samples per kernel (>= 1).
        measure: warmup, number and min_repeat_ms per :func:`interleaved_timings`, and the noise
            limits (default ``MeasureConfig(warmup=1)``).
        min_sample_s: the shortest sample wanted (calls per sample raised to it); 0 keeps
            ``measure.number`` calls, so that a kernel sees the caches the kernel before it left,
            at the price of the wake-ups described in the module docstring.
        bandwidth: bytes/s of the roofline; default :func:`~fusiontune.measure.measure_copy_bandwidth`.
        peak_flops: flop/s of the roofline; default
            :func:`~fusiontune.measure.roofline.measure_peak_flops` on numba's current threads.

    Returns:
        The profile, kernels slowest first.
    """
    from fusiontune.codegen.threading_layer import num_threads
    from fusiontune.measure.roofline import measure_copy_bandwidth, measure_peak_flops

    measure = measure or MeasureConfig(warmup=1)
    threads = num_threads()
    bandwidth = bandwidth if bandwidth is not None else measure_copy_bandwidth()
    peak_flops = peak_flops if peak_flops is not None else measure_peak_flops(threads)
    program.bind(inputs)
    program.execute()  # every intermediate holds its value before the first kernel is timed
    calls = program.kernel_calls()
    timings = interleaved_timings(
        [*calls, program.execute], rounds, measure, min_sample_s, rotate=False
    )
    rows = []
    for i, (info, t) in enumerate(zip(program.kernels, timings, strict=False)):
        rows.append(
            KernelProfile(
                name=info.group,
                index=i,
                kind=kernel_kind(info, program.graph),
                template=info.kind,
                nodes=len(info.nodes),
                median_s=t.median_s,
                iqr_s=t.iqr_s,
                noisy=is_noisy(t, measure),
                bytes_moved=int(info.bytes_moved),
                flops=int(info.flops),
                memory_s=info.bytes_moved / bandwidth,
                compute_s=info.flops / peak_flops,
            )
        )
    rows.sort(key=lambda k: (-k.median_s, k.index))
    whole = timings[-1]
    return ProfileReport(
        tuple(rows),
        whole.median_s,
        whole.iqr_s,
        rounds,
        tuple(t.number for t in timings[:-1]),
        float(bandwidth),
        float(peak_flops),
        threads,
    )


def format_count(n: float, unit: str) -> str:
    """``1.2 MB``, ``33.6 M``: a count with a decimal (SI) prefix."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _pct(p: float) -> str:
    return "-" if math.isnan(p) else f"{p:.1f}"


def _short(name: str, width: int) -> str:
    # The tail of an exporter's name (/encoder/layer.0/attention/MatMul) says the most.
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def format_profile(report: ProfileReport, top: int | None = None, width: int = 40) -> list[str]:
    """The profile as lines for a terminal: the sorted table, the sums, and the time per kind.

    Args:
        report: a profile.
        top: print only the ``top`` slowest kernels (the others summed in one line); None: all.
        width: the kernel-name column's width (longer names keep their tail).

    Returns:
        Lines without trailing newlines.
    """
    shown = report.kernels if top is None else report.kernels[:top]
    name_w = max([6, *(len(_short(k.name, width)) for k in shown)])
    lines = [
        f"profile   {len(report.kernels)} kernels timed one by one in program order, {report.rounds}"
        f" rounds; roofline: {report.bandwidth / 1e9:.1f} GB/s copy bandwidth,"
        f" {report.peak_flops / 1e9:.1f} GFLOP/s float32 sgemm peak ({report.threads} thread{'' if report.threads == 1 else 's'})",
        f"  {'kernel':<{name_w}}  {'kind':<11}  {'median':>9}  {'share':>6}  {'bytes':>9}"
        f"  {'FLOPs':>9}  {'%bw':>5}  {'%peak':>5}  bound",
    ]
    for k in shown:
        lines.append(
            f"  {_short(k.name, width):<{name_w}}  {k.kind:<11}  {format_seconds(k.median_s):>9}"
            f"  {100 * report.share(k):5.1f}%  {format_count(k.bytes_moved, 'B'):>9}"
            f"  {format_count(k.flops, ''):>9}  {_pct(k.pct_bandwidth):>5}  {_pct(k.pct_peak):>5}"
            f"  {k.bound}"
        )
    rest = report.kernels[len(shown) :]
    if rest:
        rest_s = math.fsum(k.median_s for k in rest)
        lines.append(
            f"  ... {len(rest)} more kernels: {format_seconds(rest_s)},"
            f" {100 * rest_s / report.kernel_sum_s:.1f}% of the kernels' time"
        )
    lines.append(
        f"  sum of kernel medians {format_seconds(report.kernel_sum_s)}; whole program median"
        f" {format_seconds(report.program_median_s)}; overhead {format_seconds(report.overhead_s)}"
        f" = {report.overhead_per_kernel_s * 1e6:.2f} us per kernel call"
    )
    lines.append("  by kind: " + kind_text(report))
    noisy = sum(k.noisy for k in report.kernels)
    if noisy:
        lines.append(
            f"  {noisy} of {len(report.kernels)} kernels are noisy (their samples' CV or IQR above"
            " the limits): their medians are less certain"
        )
    return lines


def kind_text(report: ProfileReport) -> str:
    """``matmul 61.2% (4), elementwise 20.1% (9), ...``: each kind's share of the kernels' time."""
    total = report.kernel_sum_s
    return ", ".join(
        f"{kind} {100 * s / total if total > 0 else math.nan:.1f}% ({n})"
        for kind, (n, s) in report.by_kind().items()
    )


def kind_shares(reports: Sequence[ProfileReport]) -> dict[str, float]:
    """Each kind's share of the kernels' time summed over ``reports`` (several models), by kind."""
    seconds: dict[str, float] = {}
    for r in reports:
        for kind, (_, s) in r.by_kind().items():
            seconds[kind] = seconds.get(kind, 0.0) + s
    total = math.fsum(seconds.values())
    ranked = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    return {kind: (s / total if total > 0 else math.nan) for kind, s in ranked}
