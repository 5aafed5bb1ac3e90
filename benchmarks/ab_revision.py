"""fusiontune at another git revision beside the working tree's, in one process, on ONNX models.

A kernel change is judged by a ratio taken in one run: each model's default program (the registry's
default passes) is built twice, once by the working tree's ``fusiontune`` and once by the base
revision's, and the two programs are timed in interleaved rounds
(``fusiontune.measure.time_interleaved``); their outputs are compared. The base revision's package
is extracted with ``git archive`` into a temporary folder and renamed ``fusiontune_base`` (every
``fusiontune`` in its files, so its kernel cache, its kernels' module names and its LLVM symbols
are its own), then imported beside ``fusiontune``. ratio = base time / working tree time: above 1,
the working tree is faster.

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/ab_revision.py --base 9aab931 \\
        search_spaces/models/real/squeezenet1_1.torchscript.onnx ...

Each ``MODEL.onnx`` runs on ``MODEL.inputs.npz`` (or ``MODEL.npz``) beside it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BASE = "fusiontune_base"


def extract_base(rev: str, into: Path) -> None:
    """``fusiontune/`` at ``rev`` under ``into/fusiontune_base``, every ``fusiontune`` in its files
    renamed (imports, the kernel cache folder, the kernels' module names, LLVM symbol names)."""
    got = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "fusiontune"], capture_output=True)
    if got.returncode != 0:
        err = got.stderr.decode(errors="replace").strip().splitlines()
        print(f"ab_revision: --base {rev}: git archive failed: {err[-1] if err else 'no message'}", file=sys.stderr)
        raise SystemExit(2)
    archive = got.stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "fusiontune").rename(into / BASE)
    for path in (into / BASE).rglob("*.py"):
        path.write_text(re.sub(r"fusiontune", BASE, path.read_text()))


def load(package: str) -> dict[str, ModuleType]:
    """The modules of ``package`` (``fusiontune`` or the base) that build a model's program."""
    names = ("ir.onnx_import", "config.fusion_config", "passes.pipeline", "runtime.program", "measure")
    return {n: importlib.import_module(f"{package}.{n}") for n in names}


def program(mods: dict[str, ModuleType], path: Path, inputs: dict[str, np.ndarray]) -> Any:
    graph = mods["ir.onnx_import"].import_onnx(path, input_shapes={k: v.shape for k, v in inputs.items()})
    fused = mods["passes.pipeline"].run_pipeline(graph, mods["config.fusion_config"].FusionConfig.defaults()).fused
    return mods["runtime.program"].build_program(fused)


def inputs_of(path: Path) -> dict[str, np.ndarray]:
    for name in (path.with_suffix(".inputs.npz"), path.with_suffix(".npz")):
        if name.exists():
            return dict(np.load(name))
    print(f"ab_revision: {path}: no {path.with_suffix('.inputs.npz').name} or {path.with_suffix('.npz').name} beside it",
          file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against (e.g. a commit)")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds (default 21)")
    ap.add_argument("models", nargs="+", type=Path, metavar="MODEL.onnx")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fusiontune-base-"))
    extract_base(args.base, tmp)
    sys.path.insert(0, str(tmp))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")])  # compile workers
    now, base = load("fusiontune"), load(BASE)
    config = now["measure"].MeasureConfig(warmup=2)
    print(f"base {args.base} against the working tree; {args.rounds} interleaved rounds, medians (IQR) in us; "
          "ratio = base / now")
    ratios = []
    for path in args.models:
        inputs = inputs_of(path)
        progs = [program(base, path, inputs), program(now, path, inputs)]
        outs = [p.run(inputs) for p in progs]
        diff = max(float(np.max(np.abs(outs[0][k].astype(np.float64) - outs[1][k]))) for k in outs[0])
        for p in progs:
            p.bind(inputs)
        t = now["measure"].time_interleaved([p.execute for p in progs], args.rounds, config, min_sample_s=0.05)
        b, n = (x.median_s * 1e6 for x in t)
        ratios.append(b / n)
        print(f"{path.stem:34s} base {b:8.1f} ({t[0].iqr_s * 1e6:.1f})  now {n:8.1f} ({t[1].iqr_s * 1e6:.1f})  "
              f"{b / n:5.3f}x  max |base - now| {diff:.1e}", flush=True)
    print(f"geometric mean {np.exp(np.mean(np.log(ratios))):.3f}x over {len(ratios)} models")


if __name__ == "__main__":
    main()
