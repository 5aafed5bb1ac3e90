"""The LLVM IR micro-kernel (codegen/microkernel.py) against numpy, and how conv plans use it."""

from __future__ import annotations

import functools

import numba
import numpy as np
import pytest

from fusiontune.codegen import microkernel
from fusiontune.codegen._window import Window
from fusiontune.codegen.conv import pack_weights, plan_packed


def _call(shape: microkernel.Shape):  # type: ignore[no-untyped-def]
    uk = microkernel.register(shape)

    @numba.njit
    def call(k, a, lda, sa, b, ldb, sb, c, ldc, ntaps, accumulate):  # type: ignore[no-untyped-def]
        uk(k, a.ctypes.data, lda, sa.ctypes.data, b.ctypes.data, ldb, sb.ctypes.data, c.ctypes.data, ldc, ntaps,
           accumulate)

    return call


def _dispatched(dtype: str):  # type: ignore[no-untyped-def]
    uk = microkernel.dispatcher(dtype)

    @numba.njit
    def call(which, k, a, lda, sa, b, ldb, sb, c, ldc, ntaps, accumulate):  # type: ignore[no-untyped-def]
        uk(which, k, a.ctypes.data, lda, sa.ctypes.data, b.ctypes.data, ldb, sb.ctypes.data, c.ctypes.data, ldc,
           ntaps, accumulate)

    return call


def _check_block(shape: microkernel.Shape, call) -> None:  # type: ignore[no-untyped-def]
    """Strided, shifted operands over several taps, overwrite then accumulate."""
    dtype, mr, nr = shape.dtype, shape.mr, shape.nr
    rng = np.random.default_rng(0)
    k, ntaps, lda, ldb, ldc = 13, 3, mr + 5, nr + 7, nr + 3
    a = rng.standard_normal(4096).astype(dtype)
    b = rng.standard_normal(4096).astype(dtype)
    sa = np.array([0, 17, 1000], dtype=np.int64)
    sb = np.array([5, 0, 2000], dtype=np.int64)
    c = np.full((mr + 1, ldc), np.nan, dtype=dtype)
    want = np.zeros((mr, nr))
    for t in range(ntaps):
        for kk in range(k):
            want += np.outer(a[sa[t] + kk * lda: sa[t] + kk * lda + mr], b[sb[t] + kk * ldb: sb[t] + kk * ldb + nr])
    call(k, a, lda, sa, b, ldb, sb, c, ldc, ntaps, 0)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(c[:mr, :nr], want, rtol=tol, atol=tol * 10)
    assert np.isnan(c[:mr, nr:]).all() and np.isnan(c[mr:]).all()  # nothing past the block is written
    call(k, a, lda, sa, b, ldb, sb, c, ldc, ntaps, 1)
    np.testing.assert_allclose(c[:mr, :nr], 2 * want, rtol=tol, atol=tol * 20)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("block", [(8, 3), (7, 2), (1, 8)])
def test_microkernel_matches_numpy(dtype: str, block: tuple[int, int]) -> None:
    shape = microkernel.Shape(dtype, *block)
    _check_block(shape, _call(shape))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dispatcher_runs_the_block_it_is_given(dtype: str) -> None:
    """Index ``which`` of the dispatching entry point is block ``blocks()[which]``, for every block
    (a wrong case in its switch computes another block's rows and columns, which this sees)."""
    call = _dispatched(dtype)
    for which, (mr, nv) in enumerate(microkernel.blocks()):
        shape = microkernel.Shape(dtype, mr, nv)
        assert microkernel.block_index(shape) == which
        _check_block(shape, functools.partial(call, which))


def test_blocks_fit_the_registers_and_shape_symbols_differ() -> None:
    regs = 32 if microkernel.VECTOR_BITS >= 512 else 16
    blocks = microkernel.blocks()
    assert blocks and all(mr * nv + nv + 1 <= regs for mr, nv in blocks)
    symbols = {microkernel.Shape("float32", mr, nv).symbol for mr, nv in blocks}
    assert len(symbols) == len(blocks)


def _window(c: int, h: int, k: int, stride: int) -> Window:
    p = k // 2
    o = (h + 2 * p - k) // stride + 1
    return Window(1, c, h, h, o, o, k, k, stride, stride, p, p, p, p, 1, 1)


def test_plan_packed_depthwise_takes_rows_and_few_positions_take_lanes() -> None:
    """One output channel per group cannot fill channel lanes; a 2x2 output of 512 channels
    (ResNet-18's last stage at 64x64) fills half a vector of grid positions at best, with 8
    lanes (AVX2) or 16 (AVX-512), but no channel block is wasted."""
    assert plan_packed(_window(1, 28, 3, 1), 1, "float32").orient == "rows"
    assert plan_packed(_window(512, 2, 3, 1), 512, "float32").orient == "lanes"
    assert plan_packed(_window(512, 2, 3, 1), 512, "float32", "rows").orient == "rows"


def test_plan_packed_takes_a_forced_block_and_names_the_allowed_ones() -> None:
    """``block`` (the ``conv_block`` schedule hint) leaves the rule only that register block, in
    the layout it asks for or the one the rule prefers; a block this CPU does not hold is an
    error that lists the ones it does."""
    win = _window(64, 56, 3, 1)
    for orient in ("rows", "lanes", None):
        plan = plan_packed(win, 64, "float32", orient, block="3x2")
        assert (plan.uk.mr, plan.uk.nv) == (3, 2) and plan.orient in ((orient,) if orient else ("rows", "lanes"))
    for bad in ("40x1", "6by2", "x2"):
        with pytest.raises(ValueError, match=r"conv_block .*: not a register block of this CPU \(.*6x2"):
            plan_packed(win, 64, "float32", block=bad)


def test_sixteen_registers_rank_blocks_by_loads_and_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AVX2's 16 registers a block is bound by its FMAs, its loads (one vector per column
    vector, one broadcast per row) or the accumulators' latency: 6x2, 5x2 and 4x3 reach the peak, 14x1
    issues 15 loads for 14 FMAs, 4x2's 8 accumulators wait on the FMA latency. Dense convs then
    take a 12-accumulator block (the formula fitted on AVX-512 ranked 13x1 and 14x1 first), in
    either layout."""
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 256)
    eff = microkernel.efficiency
    assert eff(6, 2) == eff(4, 3) == 1.0
    assert eff(4, 2) < eff(5, 2) == 1.0 and eff(4, 2) < eff(14, 1) < 1.0
    for win, m in ((_window(64, 56, 3, 1), 64), (_window(2048, 7, 1, 1), 512), (_window(256, 7, 3, 1), 256)):
        plan = plan_packed(win, m, "float32")
        assert plan.uk.vw == 8 and plan.uk.mr * plan.uk.nv == 12, plan


def test_sixteen_registers_narrow_planes_take_lanes_and_stems_keep_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AVX2's 16 registers the rows layout pays a per-row epilogue (``1 + 4 / ow``): on
    narrow planes the channel-lanes layout wins (measured on a Zen 3 core: 1x1 24->144 @4, rows
    6x2 13.2 us against lanes 4x3 7.4; SqueezeNet's 3x3 4->16 @15, rows 4x3 15.5 against lanes 5x2
    12.2), while the 3-channel stems, whose lanes epilogue is paid on a short reduction, keep
    rows."""
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 256)
    narrow_1x1 = Window(2, 24, 4, 4, 4, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1)
    assert plan_packed(narrow_1x1, 144, "float32").orient == "lanes"
    assert plan_packed(Window(2, 4, 15, 15, 15, 15, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), 16, "float32").orient == "lanes"
    assert plan_packed(_window(3, 224, 7, 2), 64, "float32").orient == "rows"
    squeezenet_stem = Window(2, 3, 64, 64, 31, 31, 3, 3, 2, 2, 0, 0, 0, 0, 1, 1)
    assert plan_packed(squeezenet_stem, 16, "float32").orient == "rows"


def test_thirty_two_registers_keep_the_fitted_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AVX-512 the measured formula of Sapphire Rapids ranks blocks by accumulators (one row
    load-bound) and the plan takes 16 lanes, whatever CPU runs the test."""
    monkeypatch.setattr(microkernel, "VECTOR_BITS", 512)
    eff = microkernel.efficiency
    assert eff(1, 4) == 0.45 and eff(4, 2) < eff(6, 2) < eff(14, 1) < eff(6, 3) <= 1.0
    plan = plan_packed(_window(64, 56, 3, 1), 64, "float32")
    assert plan.uk.vw == 16 and plan.uk.mr * plan.uk.nv + plan.uk.nv + 1 <= 32


def test_pack_weights_layout() -> None:
    """(group, channel block, tap, input channel, channel in block), zero past the group's channels."""
    w = np.arange(2 * 5 * 3 * 2 * 2, dtype=np.float32).reshape(10, 3, 2, 2)  # 2 groups of 5 channels
    p = pack_weights(w, 2, 4)
    assert p.shape == (2, 2, 4, 3, 4)
    g, m, c, i, j = 1, 2, 1, 1, 0
    assert p[g, m // 4, i * 2 + j, c, m % 4] == w[g * 5 + m, c, i, j]
    assert (p[:, 1, :, :, 1:] == 0).all()  # channels 5..7 of each group's second block


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_depthwise_microkernel_matches_numpy(dtype: str) -> None:
    """``T[:, p] = sum_t W[t, :] * X[po[p] + so[t] : ... + VW]`` over 24 positions (3 register blocks)
    and 9 taps, at offsets of a stride-2 window over a padded grid, stored one row per channel."""
    dwk = microkernel.depthwise(dtype)
    vw = microkernel.lanes(dtype)

    @numba.njit
    def call(p, x, po, so, ntaps, w, t, ldt):  # type: ignore[no-untyped-def]
        dwk(p, x.ctypes.data, po.ctypes.data, so.ctypes.data, ntaps, w.ctypes.data, t.ctypes.data, ldt)

    rng = np.random.default_rng(0)
    wp, rows = 13, microkernel.DEPTHWISE_ROWS
    p = 3 * rows
    po = np.array([(2 * (q // 6) * wp + 2 * (q % 6)) * vw for q in range(p)], dtype=np.int64)
    so = np.array([(kh * wp + kw) * vw for kh in range(3) for kw in range(3)], dtype=np.int64)
    x = rng.standard_normal(13 * wp * vw).astype(dtype)
    w = rng.standard_normal((9, vw)).astype(dtype)
    ldt = p + 5
    t = np.full((vw, ldt), np.nan, dtype=dtype)
    call(p, x, po, so, 9, w, t, ldt)
    want = np.stack([sum(w[k] * x[po[q] + so[k]:po[q] + so[k] + vw] for k in range(9)) for q in range(p)])
    np.testing.assert_allclose(t[:, :p], want.T, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)
    assert np.isnan(t[:, p:]).all()  # nothing past the positions


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("oh", "ow", "kh", "kw", "sw", "dw"), [(3, 8, 3, 3, 1, 1), (2, 11, 5, 5, 2, 1),
                                                                 (4, 9, 1, 7, 1, 2), (1, 16, 3, 3, 3, 1)])
def test_row_blocked_depthwise_microkernel_matches_numpy(dtype: str, oh: int, ow: int, kh: int, kw: int,
                                                         sw: int, dw: int) -> None:
    """Output rows of one block and more (the last block overlapping the one before), at strides
    and dilations of the columns; rows ``rs`` and kernel rows ``ks`` apart in the padded input."""
    vw = microkernel.lanes(dtype)
    dwr = microkernel.depthwise_rows(dtype, kw, sw, dw)

    @numba.njit
    def call(oh, ow, x, rs, ks, kh, w, t, ldt):  # type: ignore[no-untyped-def]
        dwr(oh, ow, x.ctypes.data, rs, ks, kh, w.ctypes.data, t.ctypes.data, ldt)

    rng = np.random.default_rng(oh * ow)
    wp = (ow - 1) * sw + (kw - 1) * dw + 3
    sh, dh = 2, 1
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    x = rng.standard_normal((hp, wp, vw)).astype(dtype)
    w = rng.standard_normal((kh * kw, vw)).astype(dtype)
    ldt = oh * ow + 3
    t = np.full((vw, ldt), np.nan, dtype=dtype)
    call(oh, ow, x, sh * wp * vw, dh * wp * vw, kh, w, t, ldt)
    want = np.zeros((oh, ow, vw))
    for i in range(kh):
        for k in range(kw):
            want += w[i * kw + k] * x[i * dh:i * dh + (oh - 1) * sh + 1:sh, k * dw:k * dw + (ow - 1) * sw + 1:sw]
    np.testing.assert_allclose(t[:, :oh * ow], want.reshape(-1, vw).T, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-5)
    assert np.isnan(t[:, oh * ow:]).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("n", "cw"), [(16, 16), (21, 5), (64, 16), (3, 1), (49, 13)])
def test_channels_last_copy_matches_numpy(dtype: str, n: int, cw: int) -> None:
    """dw_in scatters ``cw`` channel planes into (position, channel) rows at ``dst`` (lanes past ``cw``
    zero). Partial tiles at both ends: ``n`` not a multiple of the lanes, fewer channels than lanes."""
    dw_in = microkernel.transpose_in(dtype)
    vw = microkernel.lanes(dtype)

    @numba.njit
    def tin(n, x, cs, cw, dst, xt):  # type: ignore[no-untyped-def]
        dw_in(n, x.ctypes.data, cs, cw, dst.ctypes.data, xt.ctypes.data)

    cw = min(cw, vw)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((cw, n)).astype(dtype)
    dst = (np.arange(n) * 2 * vw + vw).astype(np.int64)
    xt = np.full(int(dst.max()) + 2 * vw, 7, dtype=dtype)
    tin(n, x, n, cw, dst, xt)
    lanes = np.zeros((vw, n), dtype=dtype)
    lanes[:cw] = x
    for q in range(n):
        np.testing.assert_array_equal(xt[dst[q]:dst[q] + vw], lanes[:, q])
    assert np.all(xt[:vw] == 7)  # nothing written outside the rows named


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize(("rows", "cols", "lds", "ldd"), [(3, 7, 20, 7), (5, 31, 62, 31), (2, 16, 34, 16),
                                                          (4, 33, 70, 35), (1, 1, 1, 1), (0, 5, 10, 5), (3, 0, 4, 4)])
def test_rows_copy_copies_each_row_and_nothing_else(dtype: str, step: int, rows: int, cols: int, lds: int,
                                                    ldd: int) -> None:
    """rcp copies ``rows`` rows of ``cols`` elements (every ``step``-th of a source row) between
    strides: whole vectors and a masked last one per row, whatever the width; nothing past a
    row's end is written."""
    rcp = microkernel.rows_copy(dtype, step)

    @numba.njit
    def copy(rows, cols, s, lds, d, ldd):  # type: ignore[no-untyped-def]
        rcp(rows, cols, s.ctypes.data, lds, d.ctypes.data, ldd)

    src = np.arange(max(1, rows) * lds + 64, dtype=dtype)
    dst = np.full(max(1, rows) * ldd + 64, -1, dtype=dtype)
    copy(rows, cols, src, lds, dst, ldd)
    want = np.full_like(dst, -1)
    for r in range(rows):
        want[r * ldd:r * ldd + cols] = src[r * lds:r * lds + cols * step:step]
    np.testing.assert_array_equal(dst, want)
