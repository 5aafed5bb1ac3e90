"""Vector-Jacobian rules of the contractions and the fused network ops.

* MatMul: ``da = g @ b^T``, ``db = a^T @ g``, each summed over the batch axes its operand was
  broadcast along (with ``trans_a`` / ``trans_b``, the same for ``op(a)`` / ``op(b)``, swapped back).
* Conv: the input gradient is a ConvTranspose of ``g`` with the same weights and geometry (its
  ``output_padding`` restores the input positions that no window ended on); the weight gradient is
  a Conv of the input with ``g`` as weights, batch and channel axes swapped, stride and dilation
  exchanged, cut to the kernel size. ConvTranspose runs the other way round. The catalogue's
  ConvTranspose has one or two spatial axes; a 3-D Conv's input gradient scatters its windows
  instead (as the pools do).
* MaxPool / AveragePool: each window is gathered from the flattened input (a sentinel slot stands
  for the padding), and the window's gradient is scatter-added back (ScatterND, reduction add).
  MaxPool gives a window's gradient to its maxima (ties share it), AveragePool to every real
  element, divided by the window's count.
* Attention: the probabilities are recomputed from q and k (the flash-attention backward), then
  ``dv = p^T g``, ``ds = SoftmaxGrad(p, dp) = p * (dp - sum(dp * p))`` with ``dp = g v^T``,
  ``dq = scale * ds k``, ``dk = scale * ds^T q``, and the mask's gradient is ``ds``. Where q, k,
  v and the cotangent share their batch axes and the mask needs no gradient, the rule writes one
  ``AttentionGrad`` node (AttentionGradFusionPass keeps it as one kernel, codegen/attention_grad.py,
  or expands it into this primitive form). The recomputation is a softmax of the scores, not
  ``exp(s - lse)`` from a saved row logsumexp: the Attention kernel (codegen/attention.py) keeps
  its running max and sum in registers and writes only the output, so there is no saved
  statistic to read.
* RotaryPositionEmbedding: ``rotate`` is antisymmetric, so ``dx = g * cos - rotate(g * sin)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fusiontune.ir._vjp_layout import index_const, scatter_add_axis
from fusiontune.ir.autodiff import VjpContext, mask, reshape, sum_to, swap_last, vjp
from fusiontune.ir.builder import GraphBuilder, Tensor
from fusiontune.ir.graph import Shape
from fusiontune.ir.ops import _spatial_out, avg_pool_count, window_attrs


@vjp("MatMul")
def _matmul(c: VjpContext) -> Sequence[Tensor | None]:
    # y = op(x) @ op(w), op a swap of the last two axes under trans_a / trans_b:
    # d op(x) = g @ op(w)^T and d op(w) = op(x)^T @ g, swapped back where the operand was.
    b, (x, w), g = c.b, c.inputs[:2], c.g
    ta, tb = bool(c.attrs.get("trans_a", 0)), bool(c.attrs.get("trans_b", 0))

    def t(v: Tensor, flag: bool) -> Tensor:
        return swap_last(b, v) if flag else v

    dx = b.matmul(t(w, tb), t(g, True)) if ta else b.matmul(g, t(w, not tb))
    dw = b.matmul(t(g, True), t(x, ta)) if tb else b.matmul(t(x, not ta), g)
    out = [
        sum_to(b, dx, x.shape) if c.needs[0] else None,
        sum_to(b, dw, w.shape) if c.needs[1] else None,
    ]
    if len(c.inputs) == 3:
        out.append(sum_to(b, c.g, c.x(2).shape) if c.needs[2] else None)
    return out


# ---- Conv and ConvTranspose ----------------------------------------------------------------------
def _channels_first(b: GraphBuilder, x: Tensor) -> Tensor:
    """(N, C, ...) -> (C, N, ...)."""
    return b.transpose(x, (1, 0, *range(2, len(x.shape))))


def _channel_slice(b: GraphBuilder, x: Tensor, group: int, g: int) -> Tensor:
    if group == 1:
        return x
    n = x.shape[1] // group
    return b.slice(x, [g * n], [(g + 1) * n], [1])


def _cut(b: GraphBuilder, x: Tensor, sizes: Sequence[int]) -> Tensor:
    """``x`` cut to ``sizes`` on its spatial axes (2...)."""
    if tuple(x.shape[2:]) == tuple(sizes):
        return x
    axes = list(range(2, 2 + len(sizes)))
    return b.slice(x, [0] * len(sizes), list(sizes), axes)


def _correlate(
    b: GraphBuilder,
    data: Tensor,
    taps: Tensor,
    group: int,
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> Tensor:
    """Per group, ``sum_{n, i} pad(data)[n, a, p * dilation + i * stride] * taps[n, t, i]`` as an
    (A/group, T/group, kernel...) block, the blocks side by side on axis 1, so that transposed it is
    the weight gradient of Conv (data = x, taps = g) and of ConvTranspose (data = g, taps = x)."""
    blocks = []
    for gi in range(group):
        d = _channels_first(b, _channel_slice(b, data, group, gi))
        t = _channels_first(b, _channel_slice(b, taps, group, gi))
        corr = b.op(
            "Conv",
            d,
            t,
            strides=tuple(dilations),
            pads=tuple(pads),
            dilations=tuple(strides),
            group=1,
        )
        blocks.append(_cut(b, corr, kernel))
    return blocks[0] if group == 1 else b.concat(blocks, 1)


def _bias_grad(b: GraphBuilder, g: Tensor) -> Tensor:
    return b.reduce_sum(g, (0, *range(2, len(g.shape))), keepdims=False)


@vjp("Conv")
def _conv(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, w) = c.b, c.inputs[:2]
    g = c.g
    group = int(c.attrs.get("group", 1))
    spatial = len(x.shape) - 2
    strides, pads, dil = window_attrs(c.attrs, spatial)
    kernel = w.shape[2:]
    out: list[Tensor | None] = [None, None]
    if c.needs[0]:
        if spatial <= 2:
            extra = tuple(
                x.shape[2 + i]
                + pads[i]
                + pads[spatial + i]
                - strides[i] * (g.shape[2 + i] - 1)
                - dil[i] * (kernel[i] - 1)
                - 1
                for i in range(spatial)
            )
            out[0] = b.op(
                "ConvTranspose",
                g,
                w,
                strides=strides,
                pads=pads,
                dilations=dil,
                group=group,
                output_padding=extra,
            )
        else:
            out[0] = _conv_input_grad_by_windows(b, g, w, x.shape, c.attrs, group)
    if c.needs[1]:
        # (C/group, M/group, k...) per group as a Conv over x; W wants (M, C/group, k...)
        corr = _correlate(b, x, g, group, kernel, strides, pads, dil)
        out[1] = b.transpose(corr, (1, 0, *range(2, 2 + spatial)))
    if len(c.inputs) == 3:
        out.append(_bias_grad(b, g) if c.needs[2] else None)
    return out


@vjp("ConvTranspose")
def _conv_transpose(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, w) = c.b, c.inputs[:2]
    g = c.g
    group = int(c.attrs.get("group", 1))
    spatial = len(x.shape) - 2
    strides = tuple(c.attrs.get("strides") or (1,) * spatial)
    pads = tuple(c.attrs.get("pads") or (0,) * (2 * spatial))
    dil = tuple(c.attrs.get("dilations") or (1,) * spatial)
    out: list[Tensor | None] = [None, None]
    if c.needs[0]:
        dx = b.op("Conv", g, w, strides=strides, pads=pads, dilations=dil, group=group)
        out[0] = _cut(b, dx, x.shape[2:])
    if c.needs[1]:
        # per group (M/group, C/group, k...) blocks of a Conv over g; W wants (C, M/group, k...)
        corr = _correlate(b, g, x, group, w.shape[2:], strides, pads, dil)
        out[1] = b.transpose(corr, (1, 0, *range(2, 2 + spatial)))
    if len(c.inputs) == 3:
        out.append(_bias_grad(b, g) if c.needs[2] else None)
    return out


# ---- windows: pools and the 3-D Conv input gradient ----------------------------------------------
def window_index(spatial_shape: Shape, kernel: Sequence[int], attrs: Any, ceil: bool) -> np.ndarray:
    """For every window and tap, the flat position of the input element it reads:
    (out spatial..., prod(kernel)) int64, with ``prod(spatial_shape)`` (a sentinel slot past the
    end) where the tap falls in the padding."""
    spatial = len(spatial_shape)
    strides, pads, dil = window_attrs(attrs, spatial)
    outs = [
        _spatial_out(
            spatial_shape[i], kernel[i], strides[i], pads[i], pads[spatial + i], dil[i], ceil
        )
        for i in range(spatial)
    ]
    size = int(np.prod(spatial_shape, dtype=np.int64))
    grids = np.meshgrid(
        *(np.arange(o) for o in outs), *(np.arange(k) for k in kernel), indexing="ij"
    )
    flat = np.zeros(grids[0].shape, dtype=np.int64)
    valid = np.ones(grids[0].shape, dtype=bool)
    for i in range(spatial):
        pos = grids[i] * strides[i] + grids[spatial + i] * dil[i] - pads[i]
        valid &= (pos >= 0) & (pos < spatial_shape[i])
        flat = flat * spatial_shape[i] + pos
    flat = np.where(valid, flat, size)
    return flat.reshape(*outs, int(np.prod(kernel, dtype=np.int64)))


def _scatter_windows(b: GraphBuilder, dwin: Tensor, index: np.ndarray, x_shape: Shape) -> Tensor:
    """Add each window tap's gradient (N, C, out..., taps) back to its input element."""
    size = int(np.prod(x_shape[2:], dtype=np.int64))
    flat = scatter_add_axis(b, dwin, index_const(b, index), 2, size + 1)
    return reshape(b, b.slice(flat, [0], [size], [2]), x_shape)


def _pool_geometry(c: VjpContext) -> tuple[Shape, np.ndarray, Shape]:
    x = c.x()
    kernel = tuple(c.attrs["kernel_shape"])
    index = window_index(x.shape[2:], kernel, c.attrs, bool(c.attrs.get("ceil_mode", 0)))
    y = c.y()
    return x.shape, index, (*y.shape, 1)


@vjp("MaxPool")
def _max_pool(c: VjpContext) -> Sequence[Tensor | None]:
    b, x = c.b, c.x()
    shape, index, column = _pool_geometry(c)
    flat = reshape(b, x, (shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))))
    flat = b.op("Pad", flat, pads=(0, 0, 0, 0, 0, 1), mode="constant", value=float("-inf"))
    win = b.op("Gather", flat, index_const(b, index), axis=2)  # (N, C, out..., taps)
    hit = mask(b, b.equal(win, reshape(b, c.y(), column)), c.g.dtype)
    share = b.div(reshape(b, c.g, column), b.reduce_sum(hit, -1))
    return [_scatter_windows(b, b.mul(hit, share), index, shape)]


@vjp("AveragePool")
def _average_pool(c: VjpContext) -> Sequence[Tensor | None]:
    b = c.b
    shape, index, column = _pool_geometry(c)
    inv = 1.0 / avg_pool_count(c.attrs, shape[2:])
    g = b.mul(c.g, b.const(inv.astype(c.g.dtype), dtype=c.g.dtype))
    dwin = b.expand(reshape(b, g, column), (*column[:-1], index.shape[-1]))
    return [_scatter_windows(b, dwin, index, shape)]


def _conv_input_grad_by_windows(
    b: GraphBuilder, g: Tensor, w: Tensor, x_shape: Shape, attrs: Any, group: int
) -> Tensor:
    """Conv's input gradient for any number of spatial axes: per group, ``g`` (N, M/G, out...)
    against W (M/G, C/G * taps) gives each window's gradient, scattered back to x."""
    n = x_shape[0]
    index = window_index(x_shape[2:], w.shape[2:], attrs, False)
    outs, taps = index.shape[:-1], index.shape[-1]
    m, cg = w.shape[0], w.shape[1]
    mg = m // group
    pieces = []
    for gi in range(group):
        gg = _channel_slice(b, g, group, gi)  # (N, mg, out...)
        rows = b.transpose(reshape(b, gg, (n, mg, int(np.prod(outs)))), (0, 2, 1))  # (N, P, mg)
        wg = w if group == 1 else b.slice(w, [gi * mg], [(gi + 1) * mg], [0])
        dwin = b.matmul(rows, reshape(b, wg, (mg, cg * taps)))  # (N, P, cg * taps)
        dwin = b.transpose(reshape(b, dwin, (n, int(np.prod(outs)), cg, taps)), (0, 2, 1, 3))
        pieces.append(reshape(b, dwin, (n, cg, *outs, taps)))
    dwin_all = pieces[0] if group == 1 else b.concat(pieces, 1)
    return _scatter_windows(b, dwin_all, index, x_shape)


# ---- Attention, rotary embedding ----------------------------------------------------------------
@vjp("Attention")
def _attention(c: VjpContext) -> Sequence[Tensor | None]:
    b, (q, k, v) = c.b, c.inputs[:3]
    g = c.g
    scale = float(c.attrs.get("scale", 1.0))
    masked = len(c.inputs) == 4
    if q.shape[:-2] == k.shape[:-2] == v.shape[:-2] == g.shape[:-2] and not (masked and c.needs[3]):
        # One AttentionGrad node (its expansion is the primitive form below, written out).
        dq, dk, dv = b.op("AttentionGrad", q, k, v, g, *c.inputs[3:], n_outputs=3, scale=scale)
        return [dq if c.needs[0] else None, dk if c.needs[1] else None, dv if c.needs[2] else None, *([None] if masked else [])]
    s = b.mul(b.matmul(q, swap_last(b, k)), scale)
    if len(c.inputs) == 4:
        s = b.add(s, c.x(3))
    p = b.softmax(s, -1)
    dp = b.matmul(g, swap_last(b, v))
    ds = b.op("SoftmaxGrad", p, dp, axis=-1)
    out = [
        sum_to(b, b.mul(b.matmul(ds, k), scale), q.shape) if c.needs[0] else None,
        sum_to(b, b.mul(b.matmul(swap_last(b, ds), q), scale), k.shape) if c.needs[1] else None,
        sum_to(b, b.matmul(swap_last(b, p), g), v.shape) if c.needs[2] else None,
    ]
    if len(c.inputs) == 4:
        out.append(sum_to(b, ds, c.x(3).shape) if c.needs[3] else None)
    return out


def rotate(b: GraphBuilder, x: Tensor, mode: int) -> Tensor:
    """RotaryPositionEmbedding's ``rotate`` in IR ops (ops.rotate is the definition)."""
    d = x.shape[-1]
    if mode == 0:
        lo, hi = b.split(x, (d // 2, d // 2), -1)
        return b.concat([b.neg(hi), lo], -1)
    pairs = reshape(b, x, (*x.shape[:-1], d // 2, 2))
    even, odd = b.split(pairs, (1, 1), -1)
    return reshape(b, b.concat([b.neg(odd), even], -1), x.shape)


@vjp("RotaryPositionEmbedding")
def _rotary(c: VjpContext) -> Sequence[Tensor | None]:
    b, (x, cos, sin) = c.b, c.inputs
    mode = int(c.attrs.get("mode", 0))
    g = c.g
    return [
        b.sub(b.mul(g, cos), rotate(b, b.mul(g, sin), mode)) if c.needs[0] else None,
        sum_to(b, b.mul(g, x), cos.shape) if c.needs[1] else None,
        sum_to(b, b.mul(g, rotate(b, x, mode)), sin.shape) if c.needs[2] else None,
    ]
