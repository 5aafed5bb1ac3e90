"""Score :func:`fusiontune.codegen.conv.plan_packed` against bench_blocks.py's times, and refit its
layout constants.

``benchmarks/bench_blocks.py --json FILE`` times every register block in both layouts on a set of
dense convs. This reads one or more such files and, for each shape, takes the rule's pick among
the plans that were timed (the real ``plan_packed``, with ``microkernel.blocks`` narrowed to the
blocks of the file and ``microkernel.VECTOR_BITS`` set to the file's) and scores it as the fastest
plan's time over the pick's. It prints the geometric mean and the worst share over the shapes, and
the shapes below ``--below``; with ``--grid``, the same for every combination of the values given
for the layout constants of the file's vector width, best first. No kernel is built or timed: a
fit of 156 shapes over a few hundred combinations takes a minute.

    .venv/bin/python benchmarks/fit_blocks.py blocks.json [more.json] \\
        [--grid ROWS_EPILOGUE_16_REGISTERS=0,2,4,6 --grid ROWS_STRIDED_COST_16_REGISTERS=1.08,1.16]

The constants a ``--grid`` may name are the module-level floats of ``fusiontune.codegen.conv``
that ``plan_packed`` reads (``LANES_COST``, ``ROWS_STRIDED_COST`` with 32 registers;
``LANES_EPILOGUE_16_REGISTERS``, ``LANES_EPILOGUE_MIN_K``, ``ROWS_STRIDED_COST_16_REGISTERS``,
``ROWS_EPILOGUE_16_REGISTERS`` with 16).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from bench_blocks import conv_graph, conv_key, window

from fusiontune.codegen import conv, microkernel
from fusiontune.codegen._window import Window

Times = dict[str, float]


def fail(message: str) -> None:
    """One line on stderr and exit code 2: bad input."""
    print(f"fit_blocks: {message}", file=sys.stderr)
    raise SystemExit(2)


@contextmanager
def patched(vector_bits: int, blocks: list[tuple[int, int]], constants: dict[str, float]) -> Iterator[None]:
    """``plan_packed`` as on a CPU of ``vector_bits`` with only ``blocks`` (in the CPU's order)
    and the layout ``constants`` set; everything restored after."""
    saved = {name: getattr(conv, name) for name in constants}
    bits, allowed = microkernel.VECTOR_BITS, microkernel.blocks
    microkernel.VECTOR_BITS = vector_bits
    timed = set(blocks)
    narrowed = tuple(b for b in allowed() if b in timed)
    microkernel.blocks = lambda: narrowed  # type: ignore[assignment]
    for name, value in constants.items():
        setattr(conv, name, value)
    try:
        yield
    finally:
        microkernel.VECTOR_BITS, microkernel.blocks = bits, allowed
        for name, value in saved.items():
            setattr(conv, name, value)


def load(paths: list[Path]) -> tuple[int, list[tuple[str, Window, int, Times]]]:
    """Every shape of the files: (label, window, output channels, times by plan ``"<orient>
    <mr>x<nv>"``), and the files' vector width (they must agree)."""
    bits: set[int] = set()
    shapes = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            bits.add(int(data["vector_bits"]))
            for s in data["shapes"]:
                attrs = {"strides": tuple(s["strides"]), "pads": tuple(s["pads"]), "dilations": tuple(s["dilations"])}
                key = conv_key(tuple(s["x"]), tuple(s["w"]), attrs, s["bias"])
                shapes.append((s["shape"], window(conv_graph(key)), int(s["w"][0]), dict(s["us"])))
        except OSError as e:
            fail(f"{path}: {e.strerror}")
        except json.JSONDecodeError as e:
            fail(f"{path}: not JSON ({e.msg}, line {e.lineno})")
        except KeyError as e:
            fail(f"{path}: key {e.args[0]!r} missing: not a bench_blocks.py --json file")
    if len(bits) != 1:
        fail(f"the files were timed at different vector widths {sorted(bits)}")
    return bits.pop(), shapes


def score(bits: int, shapes: list[tuple[str, Window, int, Times]], constants: dict[str, float]
          ) -> tuple[float, float, list[tuple[str, str, float, str, float]]]:
    """Geometric mean and worst of best / pick over ``shapes`` with ``constants``, and per shape
    (label, pick, its time, best plan, share)."""
    rows = []
    for label, win, m, us in shapes:
        blocks = [tuple(int(v) for v in plan.split()[1].split("x")) for plan in us]
        with patched(bits, blocks, constants):  # type: ignore[arg-type]
            p = conv.plan_packed(win, m, "float32")
        pick = f"{p.orient} {p.uk.mr}x{p.uk.nv}"
        best = min(us, key=us.__getitem__)
        rows.append((label, pick, us[pick], best, us[best] / us[pick]))
    shares = np.array([r[4] for r in rows])
    return float(np.exp(np.mean(np.log(shares)))), float(shares.min()), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path, nargs="+", help="bench_blocks.py --json files")
    ap.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="values to try for one of conv.py's layout constants (repeatable)")
    ap.add_argument("--below", type=float, default=0.9, help="list the shapes whose share is below this")
    ap.add_argument("--top", type=int, default=10, help="combinations printed with --grid")
    args = ap.parse_args()

    bits, shapes = load(args.json)
    grid: dict[str, list[float]] = {}
    for item in args.grid:
        name, _, values = item.partition("=")
        if not isinstance(getattr(conv, name, None), (int, float)):
            fail(f"--grid {item!r}: {name} is not a numeric constant of fusiontune.codegen.conv")
        try:
            grid[name] = [float(v) for v in values.split(",")]
        except ValueError:
            fail(f"--grid {item!r}: the values must be numbers separated by commas")

    current = {name: float(getattr(conv, name)) for name in grid}
    mean, worst, rows = score(bits, shapes, {})
    print(f"{len(shapes)} shapes, {bits}-bit vectors; the rule as it stands: best/pick geometric mean "
          f"{mean:.3f}, worst {worst:.3f}, {sum(r[4] < args.below for r in rows)} below {args.below}")
    for label, pick, t, best, share in rows:
        if share < args.below:
            print(f"  {label:28s} pick {pick:10s} {t:9.1f} us   best {best:10s} {t * share:9.1f} us  {share:.3f}")
    if not grid:
        return
    results = []
    for values in itertools.product(*grid.values()):
        constants = dict(zip(grid, values, strict=True))
        mean, worst, rows = score(bits, shapes, constants)
        results.append((mean, worst, sum(r[4] < args.below for r in rows), constants))
    results.sort(key=lambda r: (-r[0], -r[1]))
    print(f"\n{len(results)} combinations (the current values: {current}), best first:")
    for mean, worst, n, constants in results[: args.top]:
        print(f"  geomean {mean:.3f}  worst {worst:.3f}  below {args.below}: {n:3d}  {constants}")


if __name__ == "__main__":
    main()
