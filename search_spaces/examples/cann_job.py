"""A stand-in for an ATC conversion plus an inference run, reading CANN's fusion_switch.cfg.

Replace it with your own job: ``atc --model=net.onnx --framework=5 --soc_version=Ascend310P3
--output=net --fusion_switch_file={switch_file}`` followed by your inference script (a small
shell wrapper, or ``shell = true`` in the search space), which prints one JSON object with the
inference time and the error against your reference outputs on its last line.

What this one does, like ATC: reads ``--fusion_switch_file`` (the JSON form
``{"Switch":{"GraphFusion":{...},"UBFusion":{...}}}`` with ``"ALL"``, or the line form
``PassName:off``), refuses a malformed file or a pass it does not know with a message and exit
code 1, logs each fusion rule that ran in GE's form (``GraphFusionPass[Name]: pattern=P,
matched_times=N, effected_times=M``), writes ``fusion_result.json`` into ``--output_dir``, and
"runs" the model: its runtime and error come from the deterministic model below, not from a
device. The last line of stdout is ``{"runtime_s": ..., "error": ...}``.

The optimum within an error bound of 1e-3: every pass on except ConvBatchnormFusionPass (the
fastest, but its BN folding loses accuracy: the planted culprit), ConvConcatFusionPass and
TfMergeSubFusionPass (slower on this model). TbeEltwiseFusionPass and TbeMultiOutputFusionPass
help only together. Test hooks: see ``_job_model.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _job_model import Model, fail, fusion_result, ge_log_line, misbehave, report  # noqa: E402

GRAPH_FUSION = (  # the rules this "ATC" knows (names from the CANN documentation, seed 002)
    "ConvToFullyConnectionFusionPass",
    "SoftmaxFusionPass",
    "ConvConcatFusionPass",
    "MatMulBiasAddFusionPass",
    "PoolingFusionPass",
    "ZConcatv2dFusionPass",
    "ZConcatExt2FusionPass",
    "TfMergeSubFusionPass",
    "ConvBatchnormFusionPass",
    "TfTagNoConstFoldingFusionPass",
    "TfMergeWeightQuantFusionPass",
    "Conv2DQuantProcessFusionPass",
    "V200NotRequantFusionPass",
    "DeleteNoConstFolding",
    "ZSplitVDFusionPassV2",
    "ZSplitVDFusionPass",
    "SplitConvConcatFusionPass",
    "FixPipeAbilityProcessPass",
)
UB_FUSION = ("FusionVirtualOpSetSwitch", "TbeEltwiseFusionPass", "TbeMultiOutputFusionPass")
NOT_SWITCHABLE = ("DeleteNoConstFolding",)  # switching it off breaks the graph: refused

MODEL = Model(
    base_ms=20.0,
    base_error=1.5e-4,
    speed_ms={
        "ConvBatchnormFusionPass": -2.0,
        "SoftmaxFusionPass": -1.0,
        "MatMulBiasAddFusionPass": -1.4,
        "ConvToFullyConnectionFusionPass": -0.8,
        "PoolingFusionPass": -0.7,
        "ConvConcatFusionPass": +0.8,
        "ZConcatExt2FusionPass": -0.6,
        "TfMergeSubFusionPass": +0.7,
        "FusionVirtualOpSetSwitch": -0.6,
    },
    error={
        "ConvBatchnormFusionPass": 4e-3,
        "SoftmaxFusionPass": 1e-4,
        "MatMulBiasAddFusionPass": 5e-5,
        "TbeEltwiseFusionPass": 5e-5,
    },
    pair=("TbeEltwiseFusionPass", "TbeMultiOutputFusionPass"),
    pair_ms=-1.8,
    patterns={
        "ConvBatchnormFusionPass": ("GraphFusion", "ConvBatchnormFusion", 4),
        "SoftmaxFusionPass": ("GraphFusion", "SoftmaxFusion", 2),
        "MatMulBiasAddFusionPass": ("GraphFusion", "MatMulBiasAddFusion", 3),
        "ConvToFullyConnectionFusionPass": ("GraphFusion", "ConvToFullyConnectionFusion", 1),
        "PoolingFusionPass": ("GraphFusion", "PoolingFusion", 2),
        "ConvConcatFusionPass": ("GraphFusion", "ConvConcatFusion", 1),
        "ZConcatExt2FusionPass": ("GraphFusion", "ConcatExt2FusionPass", 1),
        "TfMergeSubFusionPass": ("GraphFusion", "TfMergeSubFusion", 1),
        "DeleteNoConstFolding": ("GraphFusion", "deleteNoConstFoldingFusion0", 2),
        "FusionVirtualOpSetSwitch": ("UBFusion", "FusionVirtualOpSetSwitch", 2),
        "TbeEltwiseFusionPass": ("UBFusion", "TbeEltwiseFusion", 6),
        "TbeMultiOutputFusionPass": ("UBFusion", "TbeMultiOutputFusion", 3),
    },
)


def read_switch_file(path: str) -> dict[str, bool]:
    """The rules on and off, ATC's way: defaults (all on), then "ALL", then the named rules."""
    known = {**dict.fromkeys(GRAPH_FUSION, "GraphFusion"), **dict.fromkeys(UB_FUSION, "UBFusion")}
    on = dict.fromkeys(known, True)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        fail(f"E10001: --fusion_switch_file {path}: cannot read: {e.strerror}")
    entries: list[tuple[str | None, str, str]] = []  # (section, name, value)
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            sections = data["Switch"]
            assert isinstance(sections, dict)
        except (ValueError, KeyError, TypeError, AssertionError):
            fail(f'E10001: --fusion_switch_file {path}: not a fusion switch file: expected {{"Switch":{{...}}}}')
        for section, body in sections.items():
            if section not in ("GraphFusion", "UBFusion") or not isinstance(body, dict):
                fail(f"E10001: --fusion_switch_file {path}: unknown section {section!r}")
            entries += [(section, name, value) for name, value in body.items()]
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, value = line.partition(":")
                section, _, name = name.strip().rpartition(".")
                entries.append((section or None, name, value.strip()))
    for section, name, value in sorted(entries, key=lambda e: e[1] != "ALL"):
        if value not in ("on", "off"):
            fail(f"E10001: --fusion_switch_file {path}: {name}: expected on or off, got {value!r}")
        if name == "ALL":
            for rule, kind in known.items():
                if (section is None or kind == section) and rule not in NOT_SWITCHABLE:
                    on[rule] = value == "on"
            continue
        if name not in known or (section is not None and known[name] != section):
            fail(f"E10001: --fusion_switch_file {path}: unknown fusion rule {name!r} in {section or 'the file'}")
        if name in NOT_SWITCHABLE and value == "off":
            fail(f"E10001: --fusion_switch_file {path}: {name} cannot be switched off")
        on[name] = value == "on"
    return on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusion_switch_file", "--fusion-switch-file", dest="switch_file")
    parser.add_argument("--output_dir", "--trial-dir", dest="output_dir", help="where fusion_result.json goes")
    args = parser.parse_args()
    on = read_switch_file(args.switch_file) if args.switch_file else dict.fromkeys(GRAPH_FUSION + UB_FUSION, True)
    print("ATC start working now, please wait for a moment.", flush=True)
    misbehave(on)
    counts = MODEL.fusion_counts(on)
    for name, (kind, pattern, matched, effected) in counts.items():
        print(ge_log_line(kind, name, pattern, matched, effected))
    if args.output_dir:
        out = Path(args.output_dir) / "fusion_result.json"
        out.write_text(json.dumps(fusion_result(counts), indent=4) + "\n", encoding="utf-8")
    print("ATC run success, welcome to the next use.", flush=True)
    report(MODEL, on)


if __name__ == "__main__":
    main()
