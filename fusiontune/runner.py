"""``fusiontune run``: fuse, compile and measure one workload under one configuration.

It prints what a MindSpore or CANN user looks for after a run: the fusion log in CANN's form, the
kernel count before and after fusion, the median runtime, the error against the float64
reference (with the float32 unfused floor beside it), the planned peak memory and, for the seeds'
small networks, the result itself. A timing whose spread stays too wide after its retries
(``MeasureConfig.max_cv``, ``max_iqr``, ``retries``) is flagged: one line says so, in the words
of :func:`fusiontune.measure.describe_noise`, and the speedup against all-off is called
unreliable. Building, checking and timing go through the tuning loop's own path
(:func:`fusiontune.tune.evaluate.build_candidate`, :func:`~fusiontune.tune.evaluate.check_and_time`).
It writes ``fusion_result.json`` for the run and, with
``--save-outputs FILE.npz``, the fused program's outputs keyed by output name. With ``--profile``
it times every kernel of the program in place and prints where the time goes, kernel by kernel,
against the roofline (:mod:`fusiontune.measure.profile`). An ONNX model runs
on random inputs, or on the arrays of ``--inputs FILE.npz`` (see
:mod:`fusiontune.workloads.onnx_model`).
"""

from __future__ import annotations

import json
import sys
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusiontune.config.flags import parse_flags
from fusiontune.config.fusion_config import ConfigError, FusionConfig
from fusiontune.config.fusion_result import write_fusion_result
from fusiontune.config.switch_file import load_config
from fusiontune.errors import UserError
from fusiontune.ir.interpreter import run_graph
from fusiontune.ir.training import LOSS, TrainSpec
from fusiontune.measure import (
    ErrorMetrics,
    MeasureConfig,
    Timing,
    describe_noise,
    noise_ratio,
    time_interleaved,
)
from fusiontune.measure.profile import ProfileReport, format_profile, profile_program
from fusiontune.passes.pipeline import PipelineResult, run_pipeline
from fusiontune.passes.registry import lookup
from fusiontune.passes.ub.recompute import PREFIX as RECOMPUTE_PREFIX
from fusiontune.passes.ub.recompute import saved_activations
from fusiontune.runtime import Program
from fusiontune.tune.evaluate import build_candidate, check_and_time
from fusiontune.workloads import Workload
from fusiontune.workloads.onnx_model import (
    ONNX_SUFFIX,
    OnnxSource,
    input_file_keys,
    load_workload,
)

SMALL_OUTPUT = 64  # print outputs up to this many elements, as the seeds print `result: [...]`


@dataclass(frozen=True)
class RunOptions:
    """What one ``run`` is asked to do.

    Attributes:
        workload: a built-in workload name, or an ONNX model file (``MODEL.onnx``).
        config_file: a ``fusion_switch.cfg`` or ``best_config.json`` (not with ``flags``).
        flags: a graph_kernel_flags string (not with ``config_file``).
        splits: ``("Pass.point", value)`` split points laid over the configuration.
        sizes: a built-in workload's sizes, ``(name, value)`` with value >= 1.
        dims: an ONNX model's symbolic dimensions, ``(name, value)`` with value >= 1.
        input_shapes: an ONNX model's whole input shapes, ``(input name, shape)``.
        inputs: an ONNX model: an ``.npz`` of input arrays keyed by input name.
        save_outputs: write the fused program's outputs there (``.npz``, keyed by output name).
        repeat: timed repeats (>= 1); None: 9.
        vs_all_off: also time the all-off program, interleaved, and print the speedup.
        out_dir: where ``fusion_result.json`` goes (default ``results/run_<workload>``).
        dump_graphs: write text and DOT dumps of every stage there.
        json: print one JSON record instead of the human summary.
        profile: also time every kernel in place and print the profile (its record in ``json``).
        profile_top: print only this many of the slowest kernels (needs ``profile``); None: all.
        train: measure the workload's training step with this loss and optimizer; None: inference.
    """

    workload: str
    config_file: Path | None = None
    flags: str | None = None
    splits: tuple[tuple[str, int], ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()
    dims: tuple[tuple[str, int], ...] = ()
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    inputs: Path | None = None
    save_outputs: Path | None = None
    repeat: int | None = None
    vs_all_off: bool = False
    out_dir: Path | None = None
    dump_graphs: Path | None = None
    json: bool = False
    profile: bool = False
    profile_top: int | None = None
    train: TrainSpec | None = None

    def __post_init__(self) -> None:
        if self.config_file is not None and self.flags is not None:
            raise UserError("a run takes a configuration file or flags, not both")
        if self.repeat is not None and self.repeat < 1:
            raise UserError(f"repeat must be >= 1, got {self.repeat}")
        if self.profile_top is not None and not self.profile:
            raise UserError("--profile-top N shortens the table of --profile: give --profile too")
        if self.profile_top is not None and self.profile_top < 1:
            raise UserError(f"--profile-top must be >= 1, got {self.profile_top}")
        if self.profile_top is not None and self.json:
            raise UserError("--profile-top shortens the printed table; --json records every kernel")


@dataclass(frozen=True)
class RunResult:
    """Everything one ``run`` measured."""

    workload: str
    params: Mapping[str, int]
    config: FusionConfig
    pipeline: PipelineResult
    program: Program
    kernels_before: int
    timing: Timing
    error: ErrorMetrics
    floor: ErrorMetrics
    outputs: Mapping[str, np.ndarray]
    train: TrainSpec | None = None


def resolve_config(
    config_file: Path | None, flags: str | None, splits: list[tuple[str, int]]
) -> FusionConfig:
    """The configuration of a run: a cfg / best_config.json, or flags, or the defaults; plus splits."""
    split_map: dict[str, int] = {}
    for name, value in splits:
        pass_name, dot, point = name.partition(".")
        info = lookup(pass_name)
        if not dot or info is None:
            raise ConfigError(f"--split {name}: expected Pass.point (see `fusiontune passes`)")
        split_map[f"{info.name}.{point}"] = value
    if config_file is not None:
        config = load_config(config_file, split_map or None)
        if config.is_job:
            raise ConfigError(
                f"{config_file}: a configuration of a command target's job (its own passes);"
                " `fusiontune run` needs one of fusiontune's passes (`fusiontune passes`)"
            )
        return config
    base = parse_flags(flags) if flags else FusionConfig.defaults()
    if not split_map:
        return base
    return FusionConfig.resolve(
        explicit=dict(base.switches),
        split_points={**base.split_points, **split_map},
        source="--split",
    )


def run_workload(
    workload: Workload,
    config: FusionConfig,
    measure: MeasureConfig | None = None,
    dump_dir: Path | None = None,
) -> RunResult:
    """Fuse, compile, check and time ``workload`` under ``config`` (the timing noise-checked)."""
    measure = measure or MeasureConfig()
    candidate = build_candidate(workload, config)
    pipeline, program = candidate.pipeline, candidate.program
    if dump_dir is not None:
        from fusiontune.ir.dump import write_stage_dumps

        write_stage_dumps(pipeline.stages, dump_dir)
    before = run_pipeline(workload.graph, FusionConfig.all_off(), train=workload.train).fused.kernel_count
    checked = check_and_time(workload, program, measure)
    floor = float32_floor(workload)
    return RunResult(
        workload.name,
        dict(workload.params),
        config,
        pipeline,
        program,
        before,
        checked.timing,
        checked.errors,
        floor,
        dict(checked.outputs),
        workload.train,
    )


def float32_floor(workload: Workload) -> ErrorMetrics:
    """The error of the unfused program in float32 against the float64 reference: the floor.

    The interpreter runs the graph once in its own dtypes (float32); no fusion can be expected
    to do better than this, and a bound below it blames even exact passes for rounding.
    """
    return workload.errors(run_graph(workload.reference_graph, workload.inputs, dtype=None))


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _error_text(e: ErrorMetrics) -> str:
    return f"max_abs {e.max_abs:.3g}  max_rel {e.max_rel:.3g}  rel_l2 {e.rel_l2:.3g}  cosine {e.cosine:.3g}"


def _compare_all_off(
    workload: Workload, program: Program, measure: MeasureConfig
) -> tuple[Timing, Timing]:
    """Time the configured program and the all-off program interleaved (a busy moment hits both).

    ``max(3, measure.repeat)`` rounds of :func:`fusiontune.measure.time_interleaved`; both are
    measured again when either is too wide, then flagged.

    Returns:
        (the configured program's timing, the all-off program's timing).
    """
    off = build_candidate(workload, FusionConfig.all_off()).program
    off.bind(workload.inputs)
    program.bind(workload.inputs)
    fused, all_off = time_interleaved(
        [program.execute, off.execute], max(3, measure.repeat), measure
    )
    return fused, all_off


def load_run_workload(options: RunOptions) -> Workload:
    """The workload of a run: a built-in name with ``sizes``, or ``MODEL.onnx`` with ``dims``,
    ``input_shapes`` and ``inputs``.

    Raises:
        UserError: an unknown name or size, options of the other kind, a model that does not
            import, or an input file that does not fit it.
    """
    name = options.workload
    dims, shapes = dict(options.dims), dict(options.input_shapes)
    inputs = None if options.inputs is None else str(options.inputs)
    if name.endswith(ONNX_SUFFIX):
        if options.sizes:
            raise UserError(
                f"{name}: --size is for built-in workloads; fix an ONNX model's dimensions with --dim NAME=N or --input-shape NAME=AxB"
            )
        return load_workload(OnnxSource.make(name, dims, shapes, inputs), train=options.train)
    if dims or shapes or inputs:
        raise UserError(
            f"--dim, --input-shape and --inputs are for ONNX models (MODEL{ONNX_SUFFIX}), not the built-in workload {name!r}"
        )
    return load_workload(name, dict(options.sizes), options.train)


def save_outputs(path: str | Path, outputs: Mapping[str, np.ndarray]) -> Path:
    """Write ``outputs`` as an ``.npz`` archive keyed by output name, readable by ``np.load``.

    The archive is what ``np.savez`` writes; it is written here entry by entry because an ONNX
    output may be named ``file`` or ``allow_pickle``, which ``np.savez(path, **outputs)`` rejects.
    The path is used as given (no ``.npz`` is appended); its folder is created.
    """
    p = Path(path)
    if p.parent != Path():
        p.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in outputs.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)
    return p


def run_command(options: RunOptions) -> int:
    """Fuse, compile, check and time one workload; print (or ``json``) and record what it measured.

    Args:
        options: what to run and how (see :class:`RunOptions`).

    Returns:
        0.

    Raises:
        UserError: a bad workload, size, configuration, flags, split point or input file.
    """
    workload = load_run_workload(options)
    inputs_file = options.inputs
    drawn = []
    if inputs_file is not None:
        keys = set(input_file_keys(inputs_file))
        weights = set(workload.train.params) if workload.train is not None else set()
        drawn = [name for name in workload.graph.inputs if name not in keys and name not in weights]
        if drawn:
            listed = ", ".join(repr(n) for n in drawn)
            print(
                f"fusiontune: note: {inputs_file} has no array for input {listed}: drawn at random",
                file=sys.stderr,
            )
    config = resolve_config(options.config_file, options.flags, list(options.splits))
    measure = MeasureConfig(repeat=options.repeat or 9, min_repeat_ms=5.0)
    t0 = time.perf_counter()
    result = run_workload(workload, config, measure, options.dump_graphs)
    out_dir = options.out_dir or Path("results") / f"run_{workload.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    fr_path = write_fusion_result(result.pipeline.report, out_dir / "fusion_result.json")
    saved = options.save_outputs
    saved_path = save_outputs(saved, result.outputs) if saved else None
    versus = (
        _compare_all_off(workload, result.program, measure) if options.vs_all_off else None
    )
    profile = profile_program(result.program, workload.inputs) if options.profile else None
    record = _record(
        result, versus, fr_path, options.dump_graphs, time.perf_counter() - t0, measure
    )
    if profile is not None:
        record["profile"] = _profile_record(profile)
    if inputs_file is not None:
        record["inputs_file"] = str(inputs_file)
        record["random_inputs"] = drawn
    if saved_path is not None:
        record["saved_outputs"] = str(saved_path)
    if options.json:
        for line in _noise_lines(record):  # the JSON on stdout stays parseable
            print(line, file=sys.stderr)
        print(json.dumps(record, indent=2))
    else:
        _print_human(result, record, profile, options.profile_top)
    return 0


def _profile_record(profile: ProfileReport) -> dict[str, Any]:
    """The profile's record with the sums a reader wants without adding them up."""
    return {
        **profile.to_json(),
        "kernel_sum_s": profile.kernel_sum_s,
        "overhead_s": profile.overhead_s,
        "overhead_per_kernel_s": profile.overhead_per_kernel_s,
        "by_kind_s": {kind: s for kind, (_, s) in profile.by_kind().items()},
    }


def _record(
    r: RunResult,
    versus: tuple[Timing, Timing] | None,
    fr_path: Path,
    dumps: Path | None,
    wall: float,
    measure: MeasureConfig,
) -> dict[str, Any]:
    caches = [k.cache for k in r.program.kernels]
    rec: dict[str, Any] = {
        "workload": r.workload,
        "params": dict(r.params),
        "graph_hash": r.pipeline.stages[0][1].graph.structural_hash(),
        "config_key": r.config.key(),
        "fusion_log": r.pipeline.report.log_lines(),
        "kernels_before": r.kernels_before,
        "kernels_after": r.program.kernel_count,
        "compile_s": r.program.compile_s,
        "kernels_compiled": caches.count("compiled"),
        "kernels_from_disk": caches.count("disk"),
        "kernels_from_memory": caches.count("memory"),
        "median_s": r.timing.median_s,
        "iqr_s": r.timing.iqr_s,
        "cv": r.timing.cv,
        "ci_low_s": r.timing.ci_low_s,
        "ci_high_s": r.timing.ci_high_s,
        "repeat": r.timing.repeat,
        "number": r.timing.number,
        "noisy": r.timing.noisy,
        "attempts": r.timing.attempts,
        "noise": describe_noise(r.timing) if r.timing.noisy else None,
        "error": r.error.__dict__,
        "float32_floor": r.floor.__dict__,
        "peak_bytes": r.program.peak_bytes,
        "naive_bytes": r.program.plan.naive_bytes,
        "fusion_result": str(fr_path),
        "wall_s": wall,
    }
    if dumps is not None:
        rec["dumps"] = str(dumps)
    if r.train is not None:
        rec["train"] = _train_record(r.train, r.program)
    if versus is not None:
        fused, off = versus
        noisy = [t for t in versus if t.noisy]
        widest = max(noisy, key=lambda t: noise_ratio(t, measure), default=None)
        rec["vs_all_off"] = {
            "fused_median_s": fused.median_s,
            "fused_iqr_s": fused.iqr_s,
            "fused_ci_low_s": fused.ci_low_s,
            "fused_ci_high_s": fused.ci_high_s,
            "fused_noisy": fused.noisy,
            "all_off_median_s": off.median_s,
            "all_off_iqr_s": off.iqr_s,
            "all_off_ci_low_s": off.ci_low_s,
            "all_off_ci_high_s": off.ci_high_s,
            "all_off_noisy": off.noisy,
            "speedup": off.median_s / fused.median_s,
            "rounds": fused.repeat,
            "attempts": fused.attempts,
            "noisy": bool(noisy),
            "noise": None if widest is None else describe_noise(widest),
        }
    return rec


def _train_record(spec: TrainSpec, program: Program) -> dict[str, Any]:
    g = program.graph
    # What the recompute split point trades: the buffered forward values the backward reads
    # (each lives from its forward kernel to its last backward reader) and the values recomputed.
    saved = {v: b for v, b in saved_activations(g).items() if v in program.plan.slot_of}
    recomputed = [n for n in g.nodes if n.name.startswith(RECOMPUTE_PREFIX)]
    return {
        "loss": spec.loss,
        "optimizer": spec.optimizer,
        "lr": spec.lr,
        "parameters": len(spec.params),
        "parameter_values": sum(g.values[p].size for p in spec.params),
        "io_bytes": program.plan.io_bytes,
        "saved_values": len(saved),
        "saved_bytes": sum(saved.values()),
        "recomputed_nodes": len(recomputed),
    }


def _noise_lines(rec: Mapping[str, Any]) -> list[str]:
    """The one-line notes of a record's noisy timings (the run's, then the all-off comparison's)."""
    lines = [rec["noise"]] if rec["noisy"] else []
    versus = rec.get("vs_all_off")
    if versus is not None and versus["noisy"]:
        lines.append(f"vs all-off: {versus['noise']}; the speedup is unreliable")
    return lines


def _print_human(
    r: RunResult,
    rec: dict[str, Any],
    profile: ProfileReport | None = None,
    top: int | None = None,
) -> None:
    sizes = " ".join(f"{k}={v}" for k, v in r.params.items())
    print(
        f"workload  {r.workload}  {sizes}  (graph {rec['graph_hash']}, config {rec['config_key']})"
    )
    # CANN prints a line per pattern tried; as with `grep -v "matched_times=0"` on a plog, the
    # lines of patterns that never matched are summarized (all of them are in --json).
    stats = r.pipeline.report.stats
    print(f"fusion log ({len(r.pipeline.report.passes_run)} passes ran, in execution order):")
    for stat in stats:
        if stat.matched_times:
            print(f"  {stat.log_line()}")
    idle = [p for p in r.pipeline.report.passes_run if r.pipeline.report.matched(p) == 0]
    if idle:
        print(f"  no match: {', '.join(idle)}")
    if "train" in rec:
        t = rec["train"]
        print(
            f"training  one step: {t['loss']} loss, backward, {t['optimizer']} update (lr {t['lr']:g})"
            f" of {t['parameters']} weights ({t['parameter_values']:,} values)"
        )
    print(f"kernels   {rec['kernels_before']} before fusion -> {rec['kernels_after']} after")
    print(
        f"compile   {rec['compile_s']:.2f} s ({rec['kernels_compiled']} compiled,"
        f" {rec['kernels_from_disk']} from the disk cache, {rec['kernels_from_memory']} already loaded)"
    )
    print(
        f"runtime   median {_fmt_time(r.timing.median_s)}  (IQR {_fmt_time(r.timing.iqr_s)},"
        f" {r.timing.repeat} x {r.timing.number} calls)"
    )
    if rec["noisy"]:
        print(rec["noise"])
    print(f"error     {_error_text(r.error)}  (vs float64 reference)")
    print(f"floor     {_error_text(r.floor)}  (float32 unfused interpreter)")
    print(
        f"memory    planned peak {_fmt_bytes(rec['peak_bytes'])} (without buffer reuse {_fmt_bytes(rec['naive_bytes'])})"
    )
    if "train" in rec:  # the step's peak: weights, gradients and optimizer state, then activations
        t = rec["train"]
        print(
            f"          of it {_fmt_bytes(t['io_bytes'])} inputs, weights, gradients and optimizer state;"
            f" {t['saved_values']} activations saved for the backward {_fmt_bytes(t['saved_bytes'])};"
            f" {t['recomputed_nodes']} forward nodes recomputed in the backward"
            " (split point RecomputeSplitFusionPass.recompute)"
        )
    if "vs_all_off" in rec:
        v = rec["vs_all_off"]
        print(
            f"all-off   median {_fmt_time(v['all_off_median_s'])} (IQR {_fmt_time(v['all_off_iqr_s'])}) vs"
            f" {_fmt_time(v['fused_median_s'])} (IQR {_fmt_time(v['fused_iqr_s'])}) interleaved:"
            f" {v['speedup']:.2f}x faster with this configuration"
            + ("; unreliable, the timing is noisy" if v["noisy"] else "")
        )
        if v["noisy"]:
            print(v["noise"])
    if profile is not None:
        for line in format_profile(profile, top):
            print(line)
    for name, arr in r.outputs.items():
        if r.train is not None and name != LOSS:
            continue  # a step's gradients and weights: --save-outputs writes them
        if arr.size <= SMALL_OUTPUT:
            print(f"result {name}: {np.array2string(arr, precision=6, suppress_small=False)}")
    print(f"wrote     {rec['fusion_result']}")
    if "saved_outputs" in rec:
        print(f"wrote     {rec['saved_outputs']} (the outputs, by name)")
    if "dumps" in rec:
        print(f"wrote     {rec['dumps']}/ (text and DOT of every stage)")
