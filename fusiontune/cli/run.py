"""``fusiontune run WORKLOAD``: fuse, compile and measure one workload under one configuration."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusiontune.cli._options import (
    assignment,
    int_at_least,
    path_or_none,
    positive_finite,
    shape_assignment,
)
from fusiontune.errors import UserError
from fusiontune.ir.training import LOSSES, OPTIMIZERS, TrainSpec
from fusiontune.workloads.builtin import list_workloads

if TYPE_CHECKING:
    from fusiontune.runner import RunOptions


def _workloads_epilog() -> str:
    lines = ["built-in workloads (default sizes; change them with --size KEY=INT):"]
    for spec in list_workloads():
        sizes = " ".join(f"{k}={v}" for k, v in spec.sizes.items())
        lines.append(f"  {spec.name:<20} {sizes}")
        lines.append(f"  {'':<20} {spec.description}")
    lines.append("or an ONNX model file, MODEL.onnx (with --dim, --input-shape, --inputs)")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    """Add ``run`` to the subcommands."""
    p = sub.add_parser(
        "run",
        help="fuse, compile and measure one workload under one configuration",
        description="Fuse, compile, check and time WORKLOAD under one fusion configuration (the\n"
        "registry defaults unless --config or --flags), and print the fusion log, the kernel\n"
        "counts, the runtime, and the error against the float64 reference beside the float32\n"
        "floor (the unfused program's own error).",
        epilog=_workloads_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "workload",
        metavar="WORKLOAD",
        help="a built-in workload name (listed below), or an ONNX model file (MODEL.onnx)",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--config", metavar="FILE", type=Path, help="fusion_switch.cfg or best_config.json"
    )
    source.add_argument("--flags", metavar='"..."', help="a graph_kernel_flags string")
    p.add_argument(
        "--split",
        metavar="NAME=INT",
        type=assignment("--split", 0),
        action="append",
        default=[],
        help="a split point, e.g. MatMulRowSplitFusionPass.row_block=128 (repeatable; 0: no cut)",
    )
    p.add_argument(
        "--dump-graphs", metavar="DIR", type=Path, help="write text and DOT dumps of every stage"
    )
    p.add_argument(
        "--size",
        metavar="KEY=INT",
        type=assignment("--size", 1),
        action="append",
        default=[],
        help="a workload size, e.g. batch=8 (repeatable; >= 1)",
    )
    p.add_argument(
        "--dim",
        metavar="NAME=INT",
        type=assignment("--dim", 1),
        action="append",
        default=[],
        help="an ONNX model: the size of a symbolic dimension, e.g. batch=2 (repeatable; >= 1)",
    )
    p.add_argument(
        "--input-shape",
        metavar="NAME=AxB",
        type=shape_assignment("--input-shape"),
        action="append",
        default=[],
        help="an ONNX model: the whole shape of one input, e.g. input_ids=2x64 (repeatable); it also"
        " fixes the named dimensions it shares with other inputs",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="an ONNX model: run on these arrays (np.savez, keyed by input name; other keys ignored);"
        " their shapes fix the input shapes, and an input the file lacks is drawn at random when"
        " its shape is fixed",
    )
    p.add_argument(
        "--save-outputs",
        metavar="FILE.npz",
        help="write the fused program's outputs there, keyed by output name (np.savez format)",
    )
    p.add_argument(
        "--repeat", metavar="N", type=int_at_least("--repeat", 1), help="timed repeats (default 9)"
    )
    p.add_argument(
        "--vs-all-off",
        action="store_true",
        help="also time the all-off program, interleaved, and print the speedup",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where fusion_result.json goes (default results/run_<workload>)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also time every kernel in place and print, slowest first, its median, share, kind,"
        " bytes, FLOPs and %% of the roofline (measured bandwidth and float32 FLOP peak), and the"
        " sum of the kernels against the whole program",
    )
    train = p.add_argument_group("training step")
    train.add_argument(
        "--train",
        action="store_true",
        help="measure the model's training step instead of its inference: forward, loss, backward"
        " and the optimizer's update of every weight; accuracy is that of the loss, the gradients"
        " and the updated weights and optimizer state",
    )
    train.add_argument(
        "--loss",
        choices=LOSSES,
        help="with --train: mse (against a random target, default) or cross_entropy (random labels"
        " over the output's last axis)",
    )
    train.add_argument(
        "--loss-output",
        metavar="NAME",
        help="with --train: the model output the loss reads (default: its first float output)",
    )
    train.add_argument(
        "--optimizer", choices=OPTIMIZERS, help="with --train: sgd (momentum 0.9, default) or adam"
    )
    train.add_argument(
        "--lr", metavar="X", type=positive_finite("--lr"), help="with --train: the learning rate (default 1e-3)"
    )
    p.add_argument(
        "--profile-top",
        metavar="N",
        type=int_at_least("--profile-top", 1),
        help="with --profile: print only the N slowest kernels (the rest summed in one line)",
    )
    p.set_defaults(func=_run)


def run_options(args: argparse.Namespace) -> RunOptions:
    """The typed options of the parsed ``run`` arguments."""
    from fusiontune.runner import RunOptions

    return RunOptions(
        workload=args.workload,
        config_file=args.config,
        flags=args.flags,
        splits=tuple(args.split),
        sizes=tuple(args.size),
        dims=tuple(args.dim),
        input_shapes=tuple(args.input_shape),
        inputs=path_or_none(args.inputs),
        save_outputs=path_or_none(args.save_outputs),
        repeat=args.repeat,
        vs_all_off=args.vs_all_off,
        out_dir=path_or_none(args.out),
        dump_graphs=args.dump_graphs,
        json=args.json,
        profile=args.profile,
        profile_top=args.profile_top,
        train=train_spec(args),
    )


def train_spec(args: argparse.Namespace) -> TrainSpec | None:
    """The training step ``--train``, ``--loss``, ``--optimizer`` and ``--lr`` ask for, or None."""
    given = {k: getattr(args, k) for k in ("loss", "loss_output", "optimizer", "lr") if getattr(args, k) is not None}
    if not args.train:
        if given:
            option = next(iter(given)).replace("_", "-")
            raise UserError(f"--{option} is an option of a training step: give --train too")
        return None
    if "loss_output" in given:
        given["output"] = given.pop("loss_output")
    return TrainSpec(**given)


def _run(args: argparse.Namespace) -> int:
    # Imported lazily so that `passes` and `convert` never pay for numba and the codegen stack.
    from fusiontune.runner import run_command

    return int(run_command(run_options(args)))
