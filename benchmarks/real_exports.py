"""The corpus of real exports, model by model: imports, kernels, passes, error against the peers.

    python benchmarks/real_exports.py [--only SUBSTRING] [--markdown] [--all-parallel]

For every exported file of search_spaces/models/real/ (MANIFEST.json): the ONNX node count, the
imported graph's node count, the kernels with every switchable pass off ("before") and with the
defaults ("after"), the GraphFusion passes that applied (effected times, canonicalization aside),
and the defaults program's max relative error (max |a - b| / max |b|) against onnxruntime and
against the eager PyTorch output stored beside the model. Nothing is timed: this is about what
fusiontune recognizes and whether it computes the same thing. It exits 1 when a file fails to
import or computes a wrong result (:data:`WRONG`), naming it.

``--all-parallel`` generates every kernel that can run in parallel as a parallel one (the
elementwise threshold at 64 points, every dense conv whatever its size), so that the parallel
code paths the corpus' small sizes never reach are checked too. It found the axpy conv's SiLU tail
losing its stores in parallel (EfficientNet-B0's exports, max_rel 18.6; fixed at f80fc52).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.ir.onnx_import import import_onnx
from fusiontune.passes.pipeline import run_pipeline
from fusiontune.runtime import build_program

CORPUS = Path(__file__).resolve().parents[1] / "search_spaces" / "models" / "real"
QUIET = {"ConstantFoldingPass", "IdentityEliminationPass", "CanonicalizationPass"}
WRONG = 1e-3
"""A max_rel above this against onnxruntime or PyTorch is a wrong result, not float32 rounding (the
corpus' worst is about 1e-4): the run exits 1 and names the file."""


def all_parallel() -> None:
    """Every kernel that can run in parallel generated as a parallel one, in this process. The
    thresholds are read when a kernel's source is generated; each codegen module holds its own
    name for ``PARALLEL_MIN_ELEMENTS`` (imported from codegen/common.py), so every module of the
    package that has one gets it set, not a list that a new module would escape."""
    import importlib
    import pkgutil

    import fusiontune.codegen as codegen
    from fusiontune.codegen import conv

    for info in pkgutil.iter_modules(codegen.__path__):
        module = importlib.import_module(f"{codegen.__name__}.{info.name}")
        if hasattr(module, "PARALLEL_MIN_ELEMENTS"):
            module.PARALLEL_MIN_ELEMENTS = 64
    conv.DENSE_PARALLEL_FACTOR = 1


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def survey(entry: dict, ort: object) -> dict:
    """One row of the table for one MANIFEST entry."""
    stem = entry["file"].removesuffix(".onnx")
    inputs = dict(np.load(CORPUS / f"{stem}.inputs.npz"))
    torch_out = dict(np.load(CORPUS / f"{stem}.torch.npz"))
    row = {"model": entry["model"], "exporter": entry["exporter"], "onnx nodes": entry["nodes"]}
    try:
        graph = import_onnx(CORPUS / entry["file"], input_shapes={k: v.shape for k, v in inputs.items()})
    except Exception as e:  # noqa: BLE001 - the table reports it
        return {**row, "imports": f"no: {str(e)[:120]}"}
    off = run_pipeline(graph, FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False}))
    on = run_pipeline(graph, FusionConfig.defaults())
    program = build_program(on.fused)
    got = program.run({k: v for k, v in inputs.items() if k in graph.inputs})
    session = ort.InferenceSession(str(CORPUS / entry["file"]), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, inputs), strict=True))
    effected: dict[str, int] = {}
    for s in on.report.stats:
        if s.kind == "GraphFusion" and s.effected_times and s.pass_name not in QUIET:
            effected[s.pass_name] = effected.get(s.pass_name, 0) + s.effected_times
    return {
        **row,
        "imports": "yes",
        "ir nodes": len(graph.nodes),
        "kernels": f"{len(off.fused.groups)} -> {program.kernel_count}",
        "passes effected": ", ".join(f"{k.removesuffix('Pass').removesuffix('Fusion')} {v}" for k, v in effected.items()),
        "max_rel ORT": max(_max_rel(got[k], want[k]) for k in torch_out),
        "max_rel PyTorch": max(_max_rel(got[k], v) for k, v in torch_out.items()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only files whose name contains this")
    parser.add_argument("--markdown", action="store_true", help="a markdown table")
    parser.add_argument("--all-parallel", action="store_true",
                        help="every kernel that can run in parallel generated as a parallel one")
    args = parser.parse_args(argv)
    if args.all_parallel:
        all_parallel()
    try:
        import onnxruntime as ort
    except ImportError:
        print("real_exports: needs onnxruntime (pip install onnxruntime)", file=sys.stderr)
        return 2
    manifest = json.loads((CORPUS / "MANIFEST.json").read_text())
    rows = []
    for entry in manifest["files"]:
        if args.only not in entry["file"]:
            continue
        if not entry.get("exported"):
            rows.append({"model": entry["model"], "exporter": entry["exporter"], "imports": f"not exported: {entry.get('error')}"[:100]})
            continue
        rows.append(survey(entry, ort))
        r = rows[-1]
        if not args.markdown:
            print(" | ".join(f"{v:.1e}" if isinstance(v, float) else str(v) for v in r.values()), flush=True)
    if args.markdown:
        cols = ["model", "exporter", "onnx nodes", "imports", "ir nodes", "kernels", "passes effected", "max_rel ORT", "max_rel PyTorch"]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(f"{r[c]:.1e}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |")
    bad = [r for r in rows if r.get("imports") != "yes" and not str(r.get("imports", "")).startswith("not exported")]
    errs = {f"{r['model']} {r['exporter']}": max(r["max_rel ORT"], r["max_rel PyTorch"]) for r in rows if "max_rel ORT" in r}
    wrong = [name for name, err in errs.items() if err > WRONG]
    print(f"{len(rows)} files, {len(bad)} failed to import, worst max_rel {max(errs.values(), default=0.0):.2e}"
          + (f"; WRONG (max_rel above {WRONG:g}): {', '.join(wrong)}" if wrong else ""), file=sys.stderr)
    return 1 if bad or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
