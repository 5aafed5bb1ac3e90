"""The report's "How to apply": the recommended configuration, as CANN, MindSpore and fusiontune take it.

CANN reads ``fusion_switch.cfg`` through ATC's ``--fusion_switch_file`` (model conversion) or the
``fusion_switch_file`` session option (training and online inference, seed 002); MindSpore reads
``graph_kernel_flags`` through ``set_context``, with graph kernel fusion enabled (seeds 000, 001,
003). Every line names the files this report wrote, by the path the report was built at, so it can
be pasted as is from the folder ``fusiontune`` ran in.
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

from fusiontune.config.flags import render_flags
from fusiontune.config.fusion_config import FusionConfig
from fusiontune.report._render import Block
from fusiontune.tune.store import StudyInfo

# ATC's --framework values (CANN's ATC reference): 0 Caffe, 1 MindSpore, 3 TensorFlow, 5 ONNX.
ONNX_FRAMEWORK = 5


def _quote(path: Path | str) -> str:
    return shlex.quote(str(path))


def _space_workload(info: StudyInfo) -> dict[str, Any]:
    """The ``[workload]`` table of the study's space, from the text stored in the study."""
    try:
        doc = tomllib.loads(info.space_toml)
    except tomllib.TOMLDecodeError:
        return {}
    table = doc.get("workload")
    return table if isinstance(table, dict) else {}


def _onnx_model(info: StudyInfo) -> Path | None:
    onnx = _space_workload(info).get("onnx")
    if not isinstance(onnx, str) or not info.space_path:
        return None
    return Path(info.space_path).parent / onnx


def _run_line(info: StudyInfo, out: Path, config: FusionConfig) -> str | None:
    """``fusiontune run`` of the recommended configuration, on the study's workload and sizes."""
    config_file = out / "best_config.json"
    model = _onnx_model(info)
    if model is not None:
        table = _space_workload(info)
        words = ["fusiontune", "run", _quote(model)]
        inputs = table.get("inputs")
        if isinstance(inputs, str):
            words += ["--inputs", _quote(Path(info.space_path).parent / inputs)]
        words += [f"--dim {k}={v}" for k, v in dict(table.get("dims") or {}).items()]
        for name, shape in dict(table.get("input_shapes") or {}).items():
            words.append(f"--input-shape {name}={'x'.join(str(int(d)) for d in shape)}")
    elif info.workload:
        words = ["fusiontune", "run", info.workload]
        words += [f"--size {k}={v}" for k, v in info.sizes.items()]
    else:
        return None
    return " ".join([*words, "--config", _quote(config_file), "--vs-all-off"])


def how_to_apply(config: FusionConfig | None, out: Path, info: StudyInfo) -> list[Block]:
    """The "How to apply" blocks of the recommendation section (none when nothing is recommended).

    Args:
        config: the recommended configuration.
        out: the results folder the report writes (``results/<study>``), as the user named it.
        info: the study's record: its workload, space and (for a command target) the job.

    Returns:
        Paragraphs and ``pre`` blocks: the ATC command and the session option with the cfg, the
        ``set_context`` line with the flags string, and, for a built-in workload or an ONNX model,
        the ``fusiontune run`` that measures the recommendation against all-off.
    """
    if config is None:
        return []
    cfg = out / "fusion_switch.cfg"
    flags = render_flags(config)
    model = _onnx_model(info)
    model_arg = _quote(model) if model is not None else "YOUR_MODEL.onnx"
    stem = model.stem if model is not None else "YOUR_MODEL"
    names = "the job's names" if config.is_job else "CANN's names"
    doc: list[Block] = [
        ("h2", "How to apply"),
        (
            "p",
            f"CANN: give ATC the switch file ({names}) when converting the model (`--framework=5`"
            " is ONNX; 0 Caffe, 1 MindSpore, 3 TensorFlow; put your SoC in `--soc_version`):",
        ),
        (
            "pre",
            f"atc --model={model_arg} --framework={ONNX_FRAMEWORK} --output={stem}"
            f" --soc_version=YOUR_SOC --fusion_switch_file={_quote(cfg)}",
        ),
        (
            "p",
            "In training or online inference, the same file goes in the session option"
            f' `custom_op.parameter_map["fusion_switch_file"].s = tf.compat.as_bytes("{cfg}")`.',
        ),
    ]
    if flags:
        doc += [
            (
                "p",
                "MindSpore: before the network is built, with graph kernel fusion on"
                f" (`{out / 'graph_kernel_flags.txt'}` holds the same string):",
            ),
            (
                "pre",
                "import mindspore\n"
                f'mindspore.set_context(enable_graph_kernel=True, graph_kernel_flags="{flags}")',
            ),
        ]
    else:
        doc += [
            (
                "p",
                "MindSpore: the recommended switches are the defaults, so no `graph_kernel_flags`"
                " are needed; keep graph kernel fusion on:",
            ),
            ("pre", "import mindspore\nmindspore.set_context(enable_graph_kernel=True)"),
        ]
    if any(v for v in config.split_points.values()):
        points = ", ".join(f"`{k}={v}`" for k, v in config.split_points.items() if v)
        doc.append(
            (
                "p",
                f"The split points ({points}) are fusiontune's own: neither CANN nor MindSpore"
                f" takes them; `{out / 'best_config.json'}` keeps them with the switches.",
            )
        )
    run = None if config.is_job else _run_line(info, out, config)
    if run is not None:
        doc += [
            ("p", "fusiontune: measure it again here, against every switchable pass off:"),
            ("pre", run),
        ]
    return doc


def how_to_apply_lines(config: FusionConfig | None, out: Path, info: StudyInfo) -> list[str]:
    """The same for a terminal: ``apply with CANN: atc ...`` and ``apply with MindSpore: ...``.

    For a command's closing summary (``tune`` and ``report`` print the paths they wrote).
    """
    pres = [b[1] for b in how_to_apply(config, out, info) if b[0] == "pre"]
    if len(pres) < 2:
        return []
    return [
        f"apply with CANN:      {pres[0]}",
        f"apply with MindSpore: {pres[1].splitlines()[-1]}",
    ]
