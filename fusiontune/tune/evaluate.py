"""Evaluate one configuration in this process: fuse, fingerprint, compile, check, time.

This is the body every embedded evaluator runs (in process, or inside a Ray actor), and the one
build/check/time path of ``fusiontune run``, the confirmation and the benchmarks:
:func:`build_candidate` fuses and compiles, :func:`check_and_time` compares the outputs with the
float64 reference and times the program with the noise check of
:func:`fusiontune.measure.time_stable`. In the tuning loop anything that goes wrong for the
candidate becomes a failed :class:`EvalResult`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fusiontune.codegen.plan import group_sources
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.graph import Graph
from fusiontune.ir.training import TrainSpec
from fusiontune.measure import ErrorMetrics, MeasureConfig, Timing, time_stable
from fusiontune.passes.fused_graph import FusedGraph
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.runtime import Program, build_program
from fusiontune.tune.records import (
    OK,
    Deny,
    EvalRequest,
    EvalResult,
    EvalStatus,
    deny_map,
    request_key,
)
from fusiontune.workloads import Workload


def fused_fingerprint(fused: FusedGraph) -> str:
    """Hash of the program a fused graph becomes: every kernel's instance (source key, shapes and
    runtime parameters), in order."""
    h = hashlib.sha256()
    for _group, src in group_sources(fused):
        h.update(src.instance.encode())
        h.update(b"|")
    return h.hexdigest()[:16]


def program_hash(graph: Graph, config: FusionConfig, deny: Deny = (), train: TrainSpec | None = None) -> str:
    """The program hash of ``config`` on ``graph`` without compiling anything (milliseconds)."""
    return fused_fingerprint(run_pipeline(graph, config, deny_map(deny), train=train).fused)


@dataclass(frozen=True)
class Candidate:
    """A configuration fused and compiled, ready to be checked and timed."""

    config: FusionConfig
    pipeline: PipelineResult
    program: Program
    program_hash: str
    deny: Deny = ()


def build_candidate(workload: Workload, config: FusionConfig, deny: Deny = ()) -> Candidate:
    """Fuse and compile ``config`` (the build phase). Raises on the candidate's own failure.

    ``deny`` refuses single applications of passes (bisection), see :class:`EvalRequest`.
    """
    pipeline = run_pipeline(workload.graph, config, deny_map(deny), train=workload.train)
    phash = fused_fingerprint(pipeline.fused)
    return Candidate(config, pipeline, build_program(pipeline.fused), phash, deny)


@dataclass(frozen=True)
class CheckResult:
    """A program run once against the reference, then (unless asked not to) timed.

    Attributes:
        outputs: the program's outputs by name (copies, float32 as computed).
        errors: the outputs against the workload's float64 reference.
        timing: the noise-checked timing, or :meth:`Timing.not_timed`.
    """

    outputs: Mapping[str, np.ndarray]
    errors: ErrorMetrics
    timing: Timing


class WrongResult(Exception):
    """The program ran, but its outputs cannot be compared with the reference (missing, misshapen)."""


def check_and_time(
    workload: Workload, program: Program, measure: MeasureConfig, *, timing: bool = True
) -> CheckResult:
    """Check ``program`` against the float64 reference, then time it (the measure phase's body).

    Correctness is checked first; the program is timed whatever its error (the runtime/error
    front needs it). Timing binds the program to ``workload.inputs`` and runs
    :func:`fusiontune.measure.time_stable` on ``program.execute``: a measurement too wide for
    ``measure.max_cv`` / ``measure.max_iqr`` is taken again up to ``measure.retries`` times, then
    flagged ``noisy``.

    Args:
        workload: the inputs and the reference outputs.
        program: a compiled program of ``workload.graph``.
        measure: the timing protocol and its noise limits.
        timing: False checks accuracy only; the timing is then :meth:`Timing.not_timed`.

    Returns:
        The outputs, their errors and the timing.

    Raises:
        WrongResult: an output is missing or has the wrong shape.
        Exception: whatever running the program raises (the caller decides what a failure is).
    """
    outputs = {k: np.array(v) for k, v in program.run(workload.inputs).items()}
    try:
        errors = workload.errors(outputs)
    except (KeyError, ValueError) as exc:  # a missing output, or one of the wrong shape
        raise WrongResult(str(exc)) from exc
    times = Timing.not_timed()
    if timing:
        program.bind(workload.inputs)
        times = time_stable(program.execute, measure)
    return CheckResult(outputs, errors, times)


def measure_candidate(
    workload: Workload,
    candidate: Candidate,
    measure: MeasureConfig,
    trial: int = -1,
    node: str = "",
    extra: Mapping[str, Any] | None = None,
    *,
    timing: bool = True,
    applications: bool = False,
) -> EvalResult:
    """Check a built candidate against the float64 reference, then time it (the measure phase).

    Correctness is checked before timing; a configuration whose error breaks a bound is still
    timed (the runtime/error front needs it). Never raises for the candidate's own failure.

    Args:
        timing: False checks accuracy only (bisection); the times are then NaN.
        applications: list every application the passes made in the result.
    """
    node = node or socket.gethostname()
    program = candidate.program
    report = candidate.pipeline.report
    fusion = report if applications else dataclasses.replace(report, applications=())
    try:
        checked = check_and_time(workload, program, measure, timing=timing)
    except Exception as exc:  # a candidate's failure is a value, not a crash of the sweep
        status = EvalStatus.WRONG_RESULT if isinstance(exc, WrongResult) else EvalStatus.RUN_FAILED
        failed = EvalResult.failure(
            trial, candidate.config, _reason(exc), node, candidate.program_hash, candidate.deny, status
        )
        return replace(failed, fusion=fusion, extra=dict(extra or {}))
    errors, times = checked.errors, checked.timing
    return EvalResult(
        trial=trial,
        config_key=request_key(candidate.config, candidate.deny),
        program_hash=candidate.program_hash,
        status=OK,
        median_s=times.median_s,
        iqr_s=times.iqr_s,
        cv=times.cv,
        min_s=times.min_s,
        samples_s=times.samples_s,
        ci_low_s=times.ci_low_s,
        ci_high_s=times.ci_high_s,
        noisy=times.noisy,
        attempts=times.attempts,
        errors=errors,
        kernels=program.kernel_count,
        compile_s=program.compile_s,
        peak_bytes=program.peak_bytes,
        node=node,
        fusion=fusion,
        extra=dict(extra or {}),
    )


def evaluate_config(
    workload: Workload, config: FusionConfig, measure: MeasureConfig, trial: int = -1, node: str = ""
) -> EvalResult:
    """Build, check and time one configuration in this process; never raises for its failure."""
    return evaluate_request(workload, EvalRequest(trial, config), measure, node)


def evaluate_request(workload: Workload, request: EvalRequest, measure: MeasureConfig, node: str = "") -> EvalResult:
    """Build, check and (unless ``request.timing`` is False) time one request; never raises for its failure."""
    config = request.config
    try:
        candidate = build_candidate(workload, config, request.deny)
    except Exception as exc:  # a candidate's failure is a value, not a crash of the sweep
        phash = ""
        try:
            phash = program_hash(workload.graph, config, request.deny, workload.train)
        except Exception:
            pass
        return EvalResult.failure(
            request.trial,
            config,
            _reason(exc),
            node or socket.gethostname(),
            phash,
            request.deny,
            EvalStatus.BUILD_FAILED,
        )
    return measure_candidate(
        workload, candidate, measure, request.trial, node, timing=request.timing, applications=request.applications
    )


def _reason(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()
