"""Sliding-window geometry shared by the Conv and Pool kernels (ONNX indexing, NCHW).

A 1-D op (N, C, L) runs as a 2-D one with H = 1: the runtime passes every buffer reshaped to the
4-D view a kernel declares, so the generated code only ever sees (N, C, H, W).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusiontune.codegen.common import NotFusable
from fusiontune.ir.ops import window_attrs


@dataclass(frozen=True)
class Window:
    """One sliding window over a 2-D (or 1-D as H = 1) input.

    Attributes:
        n, c, h, w: input dims; oh, ow: output spatial dims; kh, kw: window size.
        sh, sw: strides; ph, pw: begin pads; pe_h, pe_w: end pads; dh, dw: dilations.
    """

    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    pe_h: int
    pe_w: int
    dh: int
    dw: int

    @property
    def hp(self) -> int:
        """Rows of the padded input that the windows span: the pads included, and a ceil_mode
        window's overhang past the end pad."""
        return max(self.ph + self.h + self.pe_h, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1)

    @property
    def wp(self) -> int:
        """Columns of the padded input that the windows span (as :attr:`hp`)."""
        return max(self.pw + self.w + self.pe_w, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1)


def window_of(attrs: Mapping[str, Any], x: Sequence[int], kernel: Sequence[int], out: Sequence[int]) -> Window:
    """The 2-D window of a Conv / Pool node over input ``x`` with output ``out``.

    Raises:
        NotFusable: a 3-D (or higher) op; only 1-D and 2-D ones have kernels.
    """
    spatial = len(x) - 2
    if spatial not in (1, 2):
        raise NotFusable(f"{spatial}-D windows have no kernel (1-D and 2-D only)")
    strides, pads, dil = window_attrs(attrs, spatial)
    if spatial == 1:
        return Window(x[0], x[1], 1, x[2], 1, out[2], 1, kernel[0], 1, strides[0], 0, pads[0], 0, pads[1], 1, dil[0])
    return Window(
        x[0], x[1], x[2], x[3], out[2], out[3], kernel[0], kernel[1], strides[0], strides[1],
        pads[0], pads[1], pads[2], pads[3], dil[0], dil[1],
    )


@dataclass(frozen=True)
class PhaseCopy:
    """How an input row goes into the ``sw`` column phases of a phase-plane grid of width ``wg``
    (the plane conv's and the strided pools' scratch): input column ``j * sw + e`` lands in phase
    column ``(e + pw) % sw`` at grid column ``j + (e + pw) // sw``.

    Attributes:
        full: how many groups of ``sw`` columns one loop over ``j`` copies, every store inside the
            grid row.
        lead: per column ``e`` of a group, ``(e, phase column, grid offset)``.
        tail: the row's last columns, ``(input column, phase column, grid column)``, those that
            land inside the grid (the others lie past every window).
    """

    full: int
    lead: tuple[tuple[int, int, int], ...]
    tail: tuple[tuple[int, int, int], ...]


def phase_copy(win: Window, wg: int) -> PhaseCopy:
    """The :class:`PhaseCopy` of ``win``'s rows into a grid ``wg`` wide."""
    full = min(win.w // win.sw, wg - (win.sw - 1 + win.pw) // win.sw)
    lead = tuple((e, (e + win.pw) % win.sw, (e + win.pw) // win.sw) for e in range(win.sw))
    tail = tuple((col, (col + win.pw) % win.sw, (col + win.pw) // win.sw) for col in range(full * win.sw, win.w)
                 if (col + win.pw) // win.sw < wg)
    return PhaseCopy(full, lead, tail)


def col_range(win: Window, indent: str, kw: str = "kw") -> list[str]:
    """Statements setting ``off``, ``lo``, ``hi``: output columns ``lo <= ow < hi`` read input
    column ``ow * sw + off`` inside ``[0, W)`` for window column ``kw``."""
    return [
        f"{indent}off = {kw} * {win.dw} - {win.pw}",
        f"{indent}lo = 0 if off >= 0 else (-off + {win.sw - 1}) // {win.sw}",
        f"{indent}hi = ({win.w - 1} - off) // {win.sw} + 1 if off <= {win.w - 1} else 0",
        f"{indent}hi = min(hi, {win.ow})",
        f"{indent}lo = min(lo, hi)",
    ]
