"""Conv kernels (ONNX Conv, NCHW, 1-D and 2-D): packed weights and a register-blocked micro-kernel,
im2col + BLAS, shifted-view GEMMs, or a direct loop nest, with the fused epilogue applied to each
output block while it is in cache.

The algorithms, one epilogue:

* ``packed`` (the default for all but some depthwise convs, short 1x1 reductions and, on AVX2,
  large 1x1 convs, :data:`BLAS_1X1_MIN_POSITIONS`): the weights are packed once, when the
  program is built (a :class:`~fusiontune.codegen.common.Derived` argument computed from the
  constant; packed on entry when the weights are an input, as in a training step), into blocks of
  output channels laid out (tap, input channel, channel in block). A task (image, group, block of
  output rows) copies its rows of the zero-padded input once into phase planes, one per
  (row, column) residue of the stride (:class:`PackedGeometry`), so that every tap of any stride
  and dilation is one contiguous shifted view; its rows are as many as keep those planes within a
  share of the core's L2 (:func:`_packed_rows`). Each output block is then one call of
  codegen/microkernel.py's LLVM IR micro-kernel: up to 24 accumulators in vector registers for
  the whole reduction over taps and input channels, at 205-211 GFLOP/s on one core here against
  OpenBLAS's 168 sgemm peak. :func:`plan_packed` picks the layout: vector lanes over grid
  positions (``rows``: the ``wp - ow`` pad columns computed and dropped) or over output channels
  (``lanes``: rows are ``mr`` positions of one output row, nothing computed outside the output
  but channel padding), and the register block, by padded work over measured block efficiency.
  Its channel counts, groups and register block are runtime parameters, not constants of the
  source (:data:`PACKED_PARAMS`, :data:`PACKED_CONSTANTS`), so the convs of a network stage that
  share a geometry, a layout and an epilogue share one compile: the 846 conv kernels of the 40 real
  exports (599 of distinct sizes) are 105 compiles, 92 of them packed.

* ``im2col``: the output is cut into blocks of whole output rows, one block per (image, group,
  row block) task of a ``prange``. A task copies the input patches of its block into a scratch
  ``col`` matrix (K = C/group * kh * kw rows, one column per output position), multiplies the
  group's weight matrix (M/group x K) by it with one BLAS GEMM (codegen/blas.py) into a scratch
  block, and runs the epilogue over that block while it is in cache. ``col`` is sized to stay in
  L2 (:data:`COL_BYTES`); the split point ``ConvOutputSplitFusionPass.rows`` (schedule key
  ``conv_rows``) sets the rows per block instead.
* ``shifted`` (stride 1 only): no patch copy. A task copies its rows of the input once, zero
  padded to width ``wp = W + pads``; on that grid output position ``oh * wp + ow`` reads input
  position ``oh * wp + ow + kh * dh * wp + kw * dw`` for tap (kh, kw), so each tap's operand is the
  same padded block at another offset, and the block is the sum over the kh*kw taps of one GEMM
  each (weights reordered to (tap, M, C) once per call; :func:`gemm_at32` takes the strided views).
  The ``wp - ow`` extra columns per row are computed and dropped. A 1x1 conv without padding reads
  the input in place. Blocks hold about :data:`SHIFT_POSITIONS` positions; ``conv_rows`` applies.
* ``axpy`` (1x1 convs with a short reduction, :data:`AXPY_MAX_K`): each output row is the sum of
  the ``K`` input rows scaled by the channel's weights, one loop over a block of positions held
  in L1, with the epilogue in it (:func:`_axpy_body`). The micro-kernel's setup per block of
  outputs costs more than a reduction of 4 to 16 multiply-adds.
* ``direct``: one task per (image, group, block of :data:`DIRECT_MB` output channels, output row);
  it accumulates ``acc[j, ow] += w[m, c, kh, kw] * x[n, c, ih, ow * sw + off]`` over the input
  channels and taps, the inner loop running over the output row (contiguous loads at stride 1,
  so LLVM vectorizes it), then applies the epilogue to the row.

Which one runs: schedule ``conv_algo`` ("packed" | "im2col" | "shifted" | "direct") when a pass
set it (ConvOutputSplitFusionPass.algo; "shifted" on a strided conv runs im2col), else
:func:`choose_conv_algo`. The table below is the measurement that chose among the three older
algorithms (benchmarks/bench_conv.py on this machine, 2-core Sapphire Rapids Xeon, 2 MiB L2 per
core, float32, batch 1, medians of 5 interleaved rounds on one core, ``NUMBA_NUM_THREADS=1``,
taskset -c 0, the other core busy, loadavg ~1). benchmarks/RESULTS.md has the current table with
``packed`` and onnxruntime beside them:

    shape                          im2col  shifted   direct   numpy ref   (ms)
    stem 7x7 s2 3->64 @224           3.49        -    35.34     8.27
    3x3 64->64 @56                   3.33     2.22     6.48     7.79
    1x1 64->256 @56                  1.07     1.21     2.04     1.18
    1x1 256->64 @56                  1.29     1.24     3.26     1.94
    3x3 s2 128->128 @56              2.46        -    36.04     4.70
    1x1 s2 256->512 @56              1.73        -    50.22     3.82
    3x3 256->256 @14                 2.38     2.06    19.62     2.47
    3x3 512->512 @7                  3.42     4.93    17.02     3.17
    depthwise 3x3 32 @112            1.78     0.99     0.36     3.07
    depthwise 3x3 s2 96 @112         0.62        -     0.38     8.22
    depthwise 3x3 256 @28            1.19     0.63     0.43     6.78
    grouped 3x3 g32 256->256 @28     1.22     0.45     4.39     2.34
    resnet_cnn stem 3x3 3->32 @64    0.17     0.15     0.24     0.25
    resnet_cnn 3x3 32->32 @32        0.41     0.17     2.71     0.64
    resnet_cnn 3x3 s2 32->64 @32     0.16        -     1.29     0.38
    resnet_cnn 3x3 64->64 @16        0.28     0.16     2.33     0.42
    conv_bn_relu 3x3 32->64 @56      1.51     0.93     3.45     2.16

Shifted wins every stride-1 conv with more than a few dozen output positions (1.1x to 2.7x over
im2col): it copies the input once instead of kh*kw times, and its GEMMs over ~512 positions run
at 90-135 GFLOP/s where OpenBLAS reaches ~70-100 on im2col's longer, thinner blocks. It loses at
3x3 512->512 @7 (49 positions: the 2.4M-element weight reorder and 63-column GEMMs) and is even
with im2col on 1x1 convs in that table (im2col copies a 1x1 conv's input block too; measured
again on AVX2 in 2026-12, shifted is faster: :data:`BLAS_1X1_MIN_POSITIONS`). im2col wins every strided dense conv; direct
wins every depthwise conv (1.5x to 2.7x over the next): there the GEMM is a (1 x 9) by (9 x P)
product, so the BLAS calls cost more than the arithmetic.

``choose_conv_algo`` encodes the current result: ``packed`` beats the others on dense convs. The
depthwise-like convs (group > 1 and K = C/group * kh * kw below :data:`DIRECT_MAX_K`) were measured
apart, every grouped conv of the real corpus (EfficientNet-B0, MobileNetV3, ConvNeXt) and five
MobileNet-style ones, on the 2-core AMD EPYC, 2 threads, medians of 9 interleaved rounds, a
Sigmoid epilogue (us; direct / plane / packed):

    dw3x3 s2  8 @32     5.1 /  6.8 /  7.1      dw3x3    8 @32     9.0 /  9.0 / 11.0
    dw3x3 s2 24 @16     4.0 /  6.4 / 13.7      dw3x3   96 @16    42.7 / 16.0 / 23.8
    dw3x3 s2 48 @32    30.1 / 36.0 / 39.3      dw3x3  256 @28   173  /  67  /  84
    dw5x5 s2 48 @16    27.7 / 26.4 / 25.6      dw3x3  144 @56   227  / 132  / 157
    dw5x5 s2 192 @4     4.4 / 17.2 / 28.8      dw3x3   32 @112  181  / 136  / 108
    dw3x3 s2 96 @112  169   / 473  / 521       dw3x3   24 @8      3.8 /  4.0 /  3.5
    dw7x7   64 @2       1.2 /  8.5 /  6.5      dw5x5  240 @14   231  /  45  /  36
    dw7x7   32 @4       3.3 /  6.0 /  4.9      dw7x7   16 @8     12.9 /  5.1 /  5.2

From these, a conv with fewer than 32 outputs ran direct; a stride-1 3x3 (or smaller) one with at
least 256 outputs whose padded plane fit 64x64 points ran ``plane`` (1.2x to 1.5x over packed from
16x16 to 56x56; at 112x112 the plane left L1 and packed won); the rest of the stride-1 ones packed.

A strided one with 32 outputs or more ran ``plane``. The table above
has the plane kernel of the time, which read the input at the stride in every tap. It now reads
phase planes, as the packed kernel does, so each tap is one flat unit-stride run. Measured again
the same way, strided shapes only (us; direct / plane / packed; batch 1 unless ``n2``):

    dw3x3 s2  8 @32     5.9 /  4.1 /  7.3      dw5x5 s2  24 @8      2.5 /  3.1 /  7.3
    dw3x3 s2 24 @16     4.3 /  3.8 / 12.3      dw3x3 s2  96 @8      4.3 /  6.5 / 21.2
    dw3x3 s2 48 @32    32.7 / 21.1 / 38.6      dw5x5 s2  72 @4      1.9 /  6.7 / 11.4
    dw5x5 s2 48 @16    26.9 / 10.9 / 25.5      dw5x5 s2 192 @4      4.1 / 17.3 / 29.6
    dw3x3 s2 48 @64    78   / 42   / 74        dw3x3 s2 144 @56   185   / 113  / 203
    dw3x3 s2 96 @112  286   / 261  / 506       dw5x5 s2 240 @28   249   / 100  / 145
    dw3x3 s2 8 @64 n2  49   / 27   / 44

Plane wins every strided shape with 8x8 outputs or more (1.1x to 2.5x over direct), direct every
one with 4x4 or fewer; at 7x7 (dw5x5 s2 672 @14, benchmarks/bench_conv.py) plane took 70 us, direct 213.

``chan`` (channels-last, then a numba loop nest) was measured after them, the same way (us; direct /
plane / packed / chan, chan before its window-row statement at 1152 @7, 96 @16 and 48 @32; a
Sigmoid epilogue for the corpus shapes, SiLU for EfficientNet-B0's at 224x224; n1 unless ``n2``):

    dw5x5   192 @4     11.4 / 13.6 / 16.8 /  7.7     dw7x7    64 @2      1.1 /  8.4 /  6.6 /  2.2
    dw5x5   144 @4      8.6 / 11.1 / 12.7 /  6.3     dw5x5   288 @2      3.3 / 20.4 / 19.0 /  5.1
    dw3x3   144 @4      5.5 /  7.8 / 10.2 /  4.3     dw5x5 s2 192 @4     3.9 / 16.2 / 29.1 /  4.4
    dw5x5    64 @4      4.1 /  6.6 /  6.1 /  3.4     dw3x3 s2  96 @8     4.1 /  6.2 / 21.0 /  4.4
    dw7x7    16 @8     12.8 /  8.1 /  5.0 /  3.8     dw3x3    96 @16 n2  57 / 30.0 / 32.8 / 49.7
    dw5x5 s2 24 @8      2.5 /  3.0 /  6.7 /  2.0     dw3x3 s2 48 @32 n2  67 / 21.8 / 74.8 / 64.1
    dw5x5  1152 @7     468  / 215  / 145  / 77       dw5x5 s2 672 @14   255 / 98  / 169  / 54
    dw3x3   480 @14    137  / 104  / 110  / 81       dw5x5 s2 240 @8 n2  44 / 31.2 / 122 / 29.0

Channels-last won from 4x4 to 14x14 outputs (1.1x to 1.9x over the next best; dw3x3 s2 96 @8,
4x4 outputs, is the exception, direct 7% faster), direct below (2x2 outputs), plane or packed
above. It trails onnxruntime's NCHWc depthwise kernels (dw5x5 1152 @7: 77 us, onnxruntime
49-53): it transposes its input in and its output out, where onnxruntime keeps the blocked
layout between layers.

Then the plane kernel came to sum the taps of a phase plane in statements of up to
:data:`PLANE_TAPS_PER_STATEMENT` (the accumulator loaded and stored once per statement, where it
was once per tap; 1.1x to 1.7x), and it won every depthwise shape from 7x7 outputs on, at any
stride, kernel or plane size. ``benchmarks/bench_conv.py``, 1 thread, batch 1, no epilogue (us;
plane / packed / chan / onnxruntime):

    dw3x3    32 @112  138 / 187 / 1363 / 120      dw5x5    240 @28   137 / 218 / 303 / 101
    dw3x3 s2 96 @112  326 / 2222 / 1177 / 236     dw3x3 s2 240 @28    50 / 142 /  87 /  36
    dw3x3   256 @28    85 / 166 /  680 /  80      dw3x3    480 @14    50 /  82 /  85 /  43
    dw5x5 s2 144 @56  145 / 361 /  305 /  91      dw5x5 s2 672 @14    64 / 250 / 100 /  37
    dw5x5  1152 @7     80 / 159 /  107 /  36

and the corpus' grouped convs, 2 threads, batch 2, a Sigmoid epilogue (us; direct / plane /
packed / chan; ``@`` the input size):

    dw7x7     8 @16   51.6 /  9.2 / 12.8 / 53.9     dw5x5 s2 48 @16    53.3 / 11.9 / 45.5 / 19.9
    dw3x3     8 @32   45.2 / 15.7 / 22.2 / 56.9     dw3x3 s2 48 @32    64.6 / 28.9 / 79.3 / 58.4
    dw3x3    24 @8     7.4 /  4.0 /  6.6 /  5.1     dw7x7    16 @8     25.1 /  7.2 /  9.5 /  7.1
    dw5x5 s2 24 @8     4.4 /  2.9 / 12.2 /  3.4     dw5x5   144 @4     16.9 / 11.5 / 24.7 / 11.3
    dw3x3   144 @4    10.7 /  9.1 / 19.9 /  7.3     dw3x3 s2 96 @8      7.6 /  8.3 / 39.0 /  7.9
    dw5x5   192 @4    22.4 / 14.0 / 32.6 / 15.0     dw3x3   288 @2      5.7 /  9.9 / 32.4 /  5.0

So: ``chan`` from 4x4 to 6x6 outputs, ``direct`` below, ``plane`` from 7x7 on. Over the 23 grouped
convs of the corpus the rule's pick was the fastest on 18 and within 1.16x of it on the rest.
onnxruntime was still 1.06x to 2.2x faster per layer, most at the small planes of
EfficientNet-B0's last stages, where the copy into the phase planes and the epilogue's pass cost
as much as the taps.

Then ``chan`` was rewritten around codegen/microkernel.py (:func:`_chan_body`): blocks of one
vector of channels, weights packed when the program is built, the taps in a register-blocked
LLVM IR micro-kernel (8 positions' accumulators in registers, one weight load per tap for them),
and the copies in and out as 16x16 transposes in registers. Its numba loops had spent 20 of 35 us
of dw5x5 480 @4 (batch 2) in the taps, each reloading weight, input and accumulator, and the
rest copying one element at a time (masked vector gathers were no faster on Zen 5). Measured on
the 2-core AMD EPYC (Zen 5), one thread, batch 2, bias + Relu epilogue, medians of 9 interleaved
rounds (us; direct / plane / chan / onnxruntime's one-Conv session, its NCHWc reorders included):

    dw7x7     8 @16   49.0 /  6.6 /  7.7 / 10.5     dw3x3   288 @2      4.5 /  8.9 /  4.2 /  6.1
    dw7x7    16 @8    23.1 /  4.9 /  3.5 /  5.3     dw5x5   288 @2      4.5 / 12.9 /  4.6 /  6.3
    dw7x7    32 @4     4.4 /  4.4 /  2.3 /  4.8     dw3x3 s2  8 @32     8.7 /  3.7 /  9.0 /  9.8
    dw7x7    64 @2     1.4 /  4.8 /  2.5 /  4.8     dw3x3    24 @8      5.6 /  2.4 /  2.2 /  5.4
    dw3x3     8 @32   36.4 /  5.9 / 13.3 / 14.1     dw5x5 s2 24 @8      3.8 /  2.5 /  1.9 /  5.2
    dw5x5 s2 48 @16   48.0 / 10.2 /  7.8 /  8.4     dw3x3 s2 24 @16     6.1 /  4.4 /  3.6 /  6.6
    dw3x3 s2 48 @32   50.7 / 18.2 / 22.6 / 20.9     dw5x5    32 @4      3.5 /  2.8 /  1.6 /  4.7
    dw3x3 s2 96 @8     6.0 /  6.5 /  3.2 /  5.9     dw5x5    40 @4      4.3 /  3.3 /  1.9 /  5.0
    dw3x3   144 @4    10.5 /  6.5 /  3.0 /  5.7     dw5x5    64 @4      6.6 /  5.1 /  2.1 /  5.1
    dw5x5   144 @4    14.1 / 11.4 /  3.4 /  6.4     dw5x5 s2 72 @4      2.6 /  4.3 /  2.4 /  5.0
    dw5x5   192 @4    18.9 / 14.1 /  5.3 /  7.3     dw5x5   144 @2      2.5 /  6.6 /  2.7 /  5.2
    dw5x5 s2 192 @4    6.1 / 10.5 /  4.1 /  6.0

(the 23 grouped convs of the corpus' TorchScript exports), and EfficientNet-B0's at 224x224:

    dw3x3 s2  96 @32  101  / 39.0 / 40.6 / 42.7     dw5x5   240 @14   589 / 98.2 / 56.2 / 59.3
    dw3x3     32 @32  144  / 21.6 / 42.7 / 31.5     dw3x3   480 @14   371 / 121  / 77.2 / 83.6
    dw5x5 s2 144 @16  145  / 30.8 / 21.3 / 18.3     dw5x5 s2 672 @14  516 / 135  / 65.1 / 69.0
    dw3x3    240 @8   55.5 / 19.9 / 14.4 / 13.4     dw5x5  1152 @7    749 / 171  / 71.5 / 68.6
    dw5x5    480 @4   46.5 / 35.6 /  9.5 / 12.3     dw3x3   256 @28   882 / 155  / 156  / 155
    dw5x5 s2 144 @56  875  / 217  / 218  / 233

So now: ``chan`` from 4x4 to 15x15 outputs (:data:`CHAN_MIN_POSITIONS` to
:data:`CHAN_MAX_POSITIONS`; from 2x2 strided, :data:`CHAN_MIN_STRIDED_POSITIONS`), ``direct``
below, ``plane`` from 16x16 on. The pick is the fastest on 22 of the corpus' 23 (dw3x3 288 @2:
direct 4.5, chan 4.2) and 1.08x to 3.35x faster than onnxruntime's session on each of them. The
whole exports, one thread, two alternated runs each (us, before / after): EfficientNet-B0
354 -> 332, MobileNetV3-small 110.9 -> 99.8, ConvNeXt-tiny 163.4 -> 158.5.

Then its taps came to be computed along output rows (:func:`~fusiontune.codegen.microkernel.depthwise_rows`,
where a row holds at least one block of positions): each input vector is loaded once per kernel
row and serves the ``kw`` taps that read it. The taps of dw5x5 240 @28 took 67.6 us instead of
92.3 (the Intel Xeon VM, one thread); the kernel as a whole gained 1.05x-1.16x, its transposes
in and out now costing as much as the taps. With it, chan beats plane on windows of 25 taps or
more at any output size (:data:`CHAN_WIDE_TAPS`), and on 3x3 windows mostly not. Then the
micro-kernels came to store their results channel by channel (no copy out of the blocked layout:
dw5x5 240 @28 1.25x, dw3x3 480 @14 1.20x), and chan beat plane on 3x3 windows too from 32
channels on, up to 64x64 outputs (:data:`CHAN_MANY_CHANNELS`).

Index arithmetic: an epilogue whose ops all vectorize (no libm call: ``math="approx"``, or no
transcendental at all) casts its position indices to unsigned. numba wraps a negative signed
index around (``i < 0 ? i + n : i``); where LLVM cannot prove an index that varies in the inner
loop non-negative (it is computed from the task's block), that select makes the address
non-affine and the loop vectorizer gives up: a SiLU epilogue of 98k elements under
``math="approx"`` took 451 us instead of 76. Positions are never negative, so the cast changes
nothing else. With a libm call left (``np.exp`` under the default math) the cast is not made:
LLVM then vectorizes the loop around 16 scalar calls, measured 1.5x slower than the scalar loop.
The epilogue loops over an output row run to ``ow_n``, the row width read from the output
array's shape at run time rather than written as a constant: LLVM fully unrolls a loop of a
small constant trip count before its loop vectorizer runs, and numba leaves the SLP vectorizer
off, so a 16-wide row ran scalar (a depthwise 3x3 with a SiLU epilogue: 139 us, 73 with ``ow_n``).

The epilogue: every other node of the group is an elementwise op of ``rules.SCALAR_RULES``
(bias, Relu, Clip, LeakyRelu, HardSwish, a residual Add of a same-shape tensor, an unfolded
BatchNorm...) over values that broadcast to the conv output as (N or 1, M or 1, all spatial or
none). ``math="approx"`` writes its transcendentals as codegen/numerics.py's approximations.

The prologue (TbeElemwiseConvFusionPass): elementwise ops that compute the Conv's input from
tensors of its shape and per-channel values (an unfolded BatchNorm + Relu, a squeeze-and-excite
gate's scale) run in the packed kernel's input copy, on each element as it is copied into the
phase planes; per-channel values are computed once per image and channel. The padding stays zero
(the Conv pads the prologue's result). A kernel with a prologue always runs packed: the other
algorithms copy no input, so the rule refuses a prologue where it would pick one of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fusiontune.codegen import microkernel, target
from fusiontune.codegen._window import Window, col_range, phase_copy, window_of
from fusiontune.codegen.blas import gemm_name
from fusiontune.codegen.common import (
    PARALLEL_MIN_ELEMENTS,
    ArgSpec,
    Derived,
    KernelSource,
    Lowered,
    NotFusable,
    align,
    decorator,
    kernel_header,
    task_threads,
)
from fusiontune.codegen.loopnest import EXPENSIVE
from fusiontune.codegen.pool import max_of
from fusiontune.codegen.rules import SCALAR_RULES, literal, scalar_expr
from fusiontune.ir.graph import Node, Shape
from fusiontune.ir.ops import get_op

CONV_ALGOS = ("im2col", "direct", "shifted", "packed", "plane", "chan", "axpy")
"""Values of a group's ``schedule["conv_algo"]`` (absent: :func:`choose_conv_algo` decides)."""

COL_BYTES = 512 * 1024
"""Target size of an im2col task's patch matrix: well inside this machine's 2 MiB L2 per core."""
SHIFT_POSITIONS = 512
"""Output positions (padded-width grid) a shifted task computes: measured best for OpenBLAS here
(M=32, K=32: 134 GFLOP/s at 544 positions, 90 at 1088)."""
PACKED_PLANES_SHARE = 0.25
"""The share of a core's L2 a packed conv task's phase planes and output block may take
(:func:`_packed_rows`): on the 2 MiB L2 of an Intel Xeon VM, one thread, budgets of 128 KiB to
4 MiB of planes against onnxruntime over the table's dense convs (benchmarks/bench_conv.py): 256
and 512 KiB were best and within noise of each other; 1 MiB lost 5-10% on the 56x56 convs, 128 KiB
as much on the weight-heavy ones. A conv whose weights outweigh its planes and output takes
:data:`PACKED_WEIGHT_HEAVY_BYTES` instead, since each block more streams all of them again."""
PACKED_WEIGHT_HEAVY_BYTES = 512 * 1024
"""The planes and output block a weight-heavy packed conv task may take (:func:`_packed_rows`), at
most the core's L2. Measured on the 512 KiB L2 of an AMD EPYC (Zen 3) VM, one thread, the whole L2
against a quarter of it: 3x3 512->512 @7 (9.4 MB of weights, 0.3 MB of planes and output) 3.07x
faster, one block instead of four; 3x3 256->256 @14 1.08x. Given to every conv, the same budget
lost 6-10% on the 56x56 and 224x224 ones, whose planes outweigh their weights (3x3 64->64 @56
0.94x, 3x3 s2 128->128 @56 0.90x, the 7x7 stem 0.91x)."""

SHIFT_MIN_POSITIONS = 100
"""A stride-1 conv with fewer output positions per image than this runs im2col: its shifted GEMMs
would be too short to pay for reordering the weights every call (3x3 512->512 @7, 49 positions:
im2col 3.4 ms, shifted 4.9; @14, 196 positions: shifted wins)."""
DIRECT_MB = 4
"""Output channels a direct task accumulates together (each input row it loads serves all of them)."""
DIRECT_MAX_K = 64
"""A grouped conv whose reduction length C/group * kh * kw is below this is depthwise-like
(depthwise 3x3: 9, 7x7: 49)."""
DIRECT_MAX_POSITIONS = 32
"""A depthwise-like conv with fewer output positions per image runs direct: the packed kernel's
per-task setup (a padded copy of one channel, a scratch block) outweighs 16 or 4 outputs
(dw 3x3 @4x4, 144 channels: direct 12 us, packed 16; @2x2, 288: 6 vs 29). Not 49: at 7x7
outputs (EfficientNet-B0's last stages, benchmarks/bench_conv.py) direct took 432 us for dw5x5
1152 @7 against packed's 97, and 213 for dw5x5 s2 672 @14 against plane's 70."""
CHAN_MIN_POSITIONS = 16
"""A depthwise conv (one channel per group) with at least this many output positions (4x4) and
fewer than :data:`CHAN_MAX_POSITIONS` runs channels-last, as does a strided one from
:data:`CHAN_MIN_STRIDED_POSITIONS` on; below, direct (module docstring, the last table: dw5x5 288
@2, 2x2 outputs, direct 4.6 us, chan 5.5; dw7x7 64 @2 1.5 against 2.2)."""
CHAN_MIN_STRIDED_POSITIONS = 4
"""See :data:`CHAN_MIN_POSITIONS`: a strided depthwise conv with 2x2 outputs runs chan (dw5x5 s2 192
@4: chan 4.3 us, direct 6.2; dw5x5 s2 72 @4 2.1 against 2.7), where direct reads at the stride."""
CHAN_MAX_POSITIONS = 256
"""...from 16x16 outputs on, plane (module docstring, the last table: dw7x7 8 @16, 256 positions,
plane 7.1 us against chan's 7.8; dw3x3 s2 48 @32 17.8 against 21.8; at 14x14, dw5x5 240 @14, chan 73
against 96), but for wide windows (:data:`CHAN_WIDE_TAPS`)."""
CHAN_WIDE_TAPS = 25
"""A depthwise conv of at least this many taps (5x5, 7x7) and :data:`CHAN_WIDE_MIN_CHANNELS`
channels runs chan at any output size from :data:`CHAN_MIN_POSITIONS` on: there the row-blocked
micro-kernel loads each input vector once per kernel row for the ``kw`` taps that read it, where
the plane kernel loads one per tap. Measured on the 2-core Intel Xeon VM (AVX-512), one thread,
batch 1, no epilogue, 7 interleaved rounds (plane / chan at 16x16, 28x28 and 56x56 outputs): dw5x5
with 16 to 256 channels 1.09x-1.57x but 32 @56 0.93x; dw7x7 1.46x-2.10x; dw5x5 and dw7x7 with 8
channels (half a block of 16 lanes) 0.72x-1.02x; dw3x3 (9 taps) 0.51x-1.19x, mostly below 1
(the transposes in and out cost as much as its taps)."""
CHAN_WIDE_MIN_CHANNELS = 16
"""See :data:`CHAN_WIDE_TAPS`."""
CHAN_MANY_CHANNELS = 32
"""A depthwise conv of at least this many channels (two blocks of 16 lanes) runs chan up to
:data:`CHAN_MANY_MAX_POSITIONS` outputs, whatever its window, once its micro-kernels store their
results channel by channel (no copy out of the blocked layout). Measured the same way as
:data:`CHAN_WIDE_TAPS` (plane / chan): dw3x3 with 32 to 256 channels at 16x16 to 56x56 outputs
1.01x-1.71x at stride 1 and 1.08x-1.51x at stride 2; with 16 channels 0.82x-1.08x; dw3x3 32 @112
(112x112 outputs) 0.96x."""
CHAN_MANY_MAX_POSITIONS = 4096
"""See :data:`CHAN_MANY_CHANNELS`."""


AXPY_MAX_K = 16
"""A 1x1 conv (stride 1, no pads, one group, no prologue) with at most this many input channels
runs ``axpy`` (:func:`_axpy_body`), as does one with at most :data:`AXPY_SMALL_M` output channels
and :data:`AXPY_SMALL_M_MAX_K` input channels. Measured against ``packed`` (one Emerald Rapids
thread, batch 2, a Relu epilogue, us; axpy / packed): K8 M48 @32 16.5 / 53.5, K16 M96 @32 94 /
125, K4 M16 @15 1.7 / 6.5, K16 M64 @56 192 / 343, K16 M4 @15 2.1 / 4.8, K32 M8 @7 2.0 / 2.9;
packed wins from K = 24 up with more output channels (K24 M144 @16 53 / 55, K32 M128 @16 70 / 53,
K40 M240 @8 80 / 34): the micro-kernel's setup, per block of outputs, is paid over a reduction
that short."""

AXPY_SMALL_M = 8
"""See :data:`AXPY_MAX_K`."""

AXPY_SMALL_M_MAX_K = 32
"""See :data:`AXPY_MAX_K`."""

AXPY_MIN_POSITIONS = 16
"""``axpy`` vectorizes over an output plane's positions: a 1x1 conv on fewer (a squeeze-and-excite
block's 1x1 plane) stays ``packed``."""

AXPY_BLOCK = 4096
"""Input elements an ``axpy`` task holds at once: ``K`` rows of up to ``AXPY_BLOCK // K``
positions (16 KiB of float32), read for every output channel while they are in the L1 cache."""


BLAS_1X1_MIN_POSITIONS = 196
"""On a CPU of 16 vector registers (AVX2), a 1x1 conv (one group, no pads, no prologue) with at
least this many output positions per image (14x14) runs ``im2col``: scipy's BLAS (OpenBLAS's AVX2
sgemm) over row blocks of the input. Measured on an AMD EPYC (Zen 3) VM, Conv + BatchNorm + Relu
as one kernel, 9 interleaved rounds, packed time / BLAS time. One thread, at 14x14 to 56x56
outputs: im2col 0.94x-2.12x on ten stride-1 shapes (1.41x in geometric mean; 1x1 24->144 @28
2.12x, 128->512 @28 1.69x, 256->64 @56 0.94x) and 1.28x-1.37x on three stride-2 ones; ``shifted``
(the GEMM read in place) 0.99x-2.03x at stride 1 (1.38x). Two threads: im2col 1.18x-1.72x on six
of them, shifted 1.05x-1.57x. Below 14x14 the packed kernel wins: @13 0.76x, @8 0.82x, @4 0.78x,
@7 0.75x-1.01x (1x1 512->2048, 2048->512 and 576->96), s2 512->1024 @14 (7x7 outputs) 0.85x.

At stride 1 ``shifted`` runs them since 2026-12-07: measured again the same way (the conv with its
bias and Relu, 9 interleaved rounds, batch 1 but ``n2``), im2col time / shifted time, one thread /
two: 1x1 64->256 @56 1.060 / 1.001, 256->64 @56 1.164 / 1.316, 128->512 @28 1.009 / 0.994, 512->128
@28 1.189 / 1.180, 256->1024 @14 0.978 / 0.956, 1024->256 @14 0.998 / 1.008, 24->144 @28 n2 0.981 /
0.987, 64->256 @56 n2 1.038 / 1.083: 1.05x and 1.06x in geometric mean, at worst 0.96x. im2col
copies each block's patch matrix (for a 1x1 conv, the input block itself) before its GEMM,
shifted hands BLAS the input in place: the copy weighs most where the reduction is long against
the output channels (up to 1.32x). In the corpus only DenseNet-121's five 1x1 convs without a
prologue change (``benchmarks/ab_revision.py``, 21 rounds: 1.013x and 0.996x, the same outputs)."""


def choose_conv_algo(cg: int, mg: int, kh: int, kw: int, group: int = 1,
                     positions: int = SHIFT_MIN_POSITIONS, *, strided: bool = False,
                     padded: bool = False, prologue: bool = False) -> str:
    """The algorithm the measurements favour for a conv with ``cg`` input and ``mg`` output
    channels per group, a ``kh x kw`` kernel, ``group`` groups and ``positions`` output positions
    per image (see the module docstring): ``packed``, except for a depthwise-like conv (several
    groups, a reduction shorter than :data:`DIRECT_MAX_K`) and a 1x1 conv with a short reduction.
    The depthwise-like one runs ``chan`` when it has one input and one output channel per group
    and :data:`CHAN_MIN_POSITIONS` (strided: :data:`CHAN_MIN_STRIDED_POSITIONS`) to
    :data:`CHAN_MAX_POSITIONS` outputs, or more with a wide window (:data:`CHAN_WIDE_TAPS`) or
    many channels (:data:`CHAN_MANY_CHANNELS`);
    else ``direct`` with
    fewer than :data:`DIRECT_MAX_POSITIONS` output positions; else ``plane``, at any stride,
    kernel and plane size. The 1x1 one (not ``strided``, not ``padded``, no ``prologue``)
    runs ``axpy`` (:data:`AXPY_MAX_K`); on AVX2, one of :data:`BLAS_1X1_MIN_POSITIONS` outputs or
    more (not ``padded``, no ``prologue``) runs on BLAS: ``shifted`` (the input read in place),
    ``im2col`` when ``strided``."""
    if group > 1 and cg * kh * kw < DIRECT_MAX_K:
        least = CHAN_MIN_STRIDED_POSITIONS if strided else CHAN_MIN_POSITIONS
        wide = kh * kw >= CHAN_WIDE_TAPS and group >= CHAN_WIDE_MIN_CHANNELS
        many = group >= CHAN_MANY_CHANNELS and positions <= CHAN_MANY_MAX_POSITIONS
        if cg == mg == 1 and least <= positions and (positions < CHAN_MAX_POSITIONS or wide or many):
            return "chan"
        if positions < DIRECT_MAX_POSITIONS:
            return "direct"
        return "plane"
    if axpy_applies(kh, kw, group, strided=strided, padded=padded, prologue=prologue) \
            and positions >= AXPY_MIN_POSITIONS \
            and (cg <= AXPY_MAX_K or (mg <= AXPY_SMALL_M and cg <= AXPY_SMALL_M_MAX_K)):
        return "axpy"
    if (microkernel.VECTOR_BITS < 512 and kh == kw == 1 and group == 1 and not padded and not prologue
            and positions >= BLAS_1X1_MIN_POSITIONS):
        return "im2col" if strided else "shifted"
    return "packed"


def axpy_applies(kh: int, kw: int, group: int, *, strided: bool, padded: bool, prologue: bool) -> bool:
    """Whether ``axpy`` can run a conv: 1x1, one group, stride 1, no pads, no prologue."""
    return kh == kw == 1 and group == 1 and not strided and not padded and not prologue


DENSE_PARALLEL_FACTOR = 12
"""A dense conv (every algorithm but ``plane``) runs in parallel from this many times
:data:`~fusiontune.codegen.common.PARALLEL_MIN_ELEMENTS` multiply-adds on (393k). A numba parallel
region costs about 1.8 us to launch on TBB here, and the packed kernel runs a small conv at 35-60
multiply-adds a ns, so below about 400k a second thread gains less than the launch costs: with 2
threads, ResNet18's small export (seventeen 3x3 convs of 296k-300k MACs at 2x2 to 16x16, each 5-9 us
serial, 5-25% slower in parallel) ran 159 us at a factor of 8 and 136 us at 12, the other CNN exports
within 0.5% (interleaved, one process). At 32 (1M), EfficientNet-B0 lost 10%: its 467k and 934k
convs with a SiLU take 16 and 44 us in parallel, 21 and 70 serially."""

_COMMUTATIVE = ("Add", "Mul")
"""Epilogue ops whose operands are written in a fixed order (IEEE sum and product commute exactly)."""

_LIBM_CALL = re.compile(r"\b(?:np|math)\.(?!sqrt\b|floor\b|ceil\b|float32\b|float64\b|uint64\b|int64\b|abs\b|fabs\b|inf\b|nan\b|maximum\b|minimum\b|isnan\b|isinf\b)\w+\(")
"""A call in an epilogue statement that LLVM cannot vectorize (a libm function: exp, tanh, erf...).
``np.maximum``, ``np.minimum`` (Relu, Clip), ``np.isnan`` and ``np.isinf`` are selects and compares,
not calls: while this pattern took them for libm calls, every Conv + Relu kernel indexed with
signed integers and its input copy ran scalar (SqueezeNet's stem, 3x3 s2 3->16 @64 batch 2, one
thread: 28 us, 18.7 with unsigned indices and the stride-2 copy split in halves)."""


def _ix(expr: str) -> str:
    """A position index: ``IX(expr)``, made ``numba.uint64(expr)`` or ``(expr)`` once the kernel
    knows whether its epilogue vectorizes (module docstring, "Index arithmetic")."""
    return f"IX({expr})"


def _epilogue_view(shape: Shape, out: Shape) -> tuple[int, int, int] | None:
    """The (N, M, P) view of an epilogue array over the conv output ``out`` (P: flattened
    spatial), or None when it broadcasts over part of the spatial dims only."""
    s = align(shape, len(out))
    if len(shape) > len(out) or any(d not in (1, o) for d, o in zip(s, out, strict=True)):
        return None
    sp, osp = s[2:], out[2:]
    p = int(np.prod(osp))
    if tuple(sp) == tuple(osp):
        pv = p
    elif all(d == 1 for d in sp):
        pv = 1
    else:
        return None
    return (s[0], s[1], pv)


def _find_conv(low: Lowered, pool: Node | None = None) -> tuple[Node, list[Node], list[Node]]:
    """The group's Conv, its prologue (the nodes that compute its input) and its epilogue (but
    ``pool``, the MaxPool that ends it: :func:`_find_pool`)."""
    nodes = [n for n in low.nodes if n is not pool]
    convs = [n for n in nodes if n.op == "Conv"]
    if len(convs) != 1:
        raise NotFusable("a conv kernel holds exactly one Conv")
    conv = convs[0]
    producer = {o: n for n in nodes for o in n.outputs}
    ahead: set[str] = set()  # names of the nodes the Conv's input is computed by
    todo = [conv.inputs[0]] if conv.inputs[0] in producer else []
    while todo:
        node = producer[todo.pop()]
        if node.name not in ahead:
            ahead.add(node.name)
            todo += [i for i in node.inputs if i in producer]
    pro = [n for n in nodes if n.name in ahead]
    epi = [n for n in nodes if n is not conv and n.name not in ahead]
    produced = {o for n in nodes for o in n.outputs}
    if any(i in produced for i in conv.inputs[1:]):
        raise NotFusable("a conv kernel computes no weights or bias: they come from outside")
    for n in pro:
        if n.op not in SCALAR_RULES:
            raise NotFusable(f"{n.op} cannot be a Conv prologue")
    for n in epi:
        if n.op not in SCALAR_RULES:
            raise NotFusable(f"{n.op} cannot be a Conv epilogue")
    return conv, pro, epi


POOL_FUSED_MAX_BYTES = 256 * 1024
"""A MaxPool joins its conv's kernel when the conv's output plane (all of a group's channels, the
whole image: the pool's windows cross any block of rows) takes at most this many bytes, so that
the block the pool reads is still in L2."""


def _find_pool(low: Lowered, outputs: Sequence[str]) -> Node | None:
    """The MaxPool that ends a conv kernel (ConvMaxPoolFusionPass), or None.

    Raises:
        NotFusable: another window op, more than one, or a MaxPool that is not the last node
            (its output the kernel's one output, read by nothing in it, its input made in it).
    """
    pools = [n for n in low.nodes if n.op in ("MaxPool", "AveragePool")]
    if not pools:
        return None
    if len(pools) > 1 or pools[0].op != "MaxPool":
        raise NotFusable("a conv kernel ends with at most one MaxPool")
    pool = pools[0]
    if len(pool.outputs) != 1 or list(outputs) != [pool.outputs[0]]:
        raise NotFusable("a conv kernel's MaxPool (no Indices output) makes its one output")
    if any(pool.outputs[0] in n.inputs for n in low.nodes):
        raise NotFusable("nothing in a conv kernel reads its MaxPool")
    if not any(pool.inputs[0] in n.outputs for n in low.nodes if n is not pool):
        raise NotFusable("a conv kernel's MaxPool reads what the kernel computes")
    return pool


def _pool_lines(win: Window, pw: Window, out: str, dtype: str, channel0: int = 0) -> list[str]:
    """A packed ``lanes`` task's MaxPool over its block (``blk[position, channel]``: the whole
    output plane of image ``n``, group ``g``, after the epilogue): per window, one loop over the
    block's channels, each a straight-line max of the window's taps (literal offsets; the
    compare-and-select tree with one NaN test of codegen/pool.py's ``max_of``), contiguous, so
    it vectorizes, into a block of pooled positions by channels; then each channel's plane is
    stored as one run (from channel ``channel0`` on: a Concat's part, ConvConcatFusionPass).
    The windows lie inside the plane (:func:`_pool_window`). One image of SqueezeNet's stem (16
    channels @31, 3x3 s2), one thread: a loop over the taps with a running max, each
    bounds-checked, 110 us; the taps written out, each window's channels stored at once to the
    output's planes 5.1-6.0 us, into the block and then transposed 4.0-4.4 us."""
    taps = [f"blk[q + {a * pw.dh * win.ow + b * pw.dw}, mm]" for a in range(pw.kh) for b in range(pw.kw)]
    return [
        f"        pb = np.empty(({pw.oh * pw.ow}, k_ldc), dtype=np.{dtype})",
        f"        for i in range({pw.oh}):",
        f"            for j in range({pw.ow}):",
        f"                q = {_ix(f'i * {pw.sh * win.ow} + j * {pw.sw}')}",
        f"                o = {_ix(f'i * {pw.ow} + j')}",
        "                for mm in range(k_mg):",
        f"                    pb[o, mm] = {max_of(taps, dtype)}",
        "        for mm in range(k_mg):",
        f"            for o in range({pw.oh * pw.ow}):",
        f"                {out}[n, {channel0} + g * k_mg + mm, o] = pb[o, mm]",
    ]


POOL_FUSED_MAX_TAPS = 25
"""A fused MaxPool's window is written out tap by tap: up to 5x5."""


def _pool_window(low: Lowered, pool: Node, win: Window, oshape: Shape) -> Window:
    """The fused MaxPool's window over the conv's output.

    Raises:
        NotFusable: a 1-D conv, a pool over another shape, a window that reads padding or
            more than :data:`POOL_FUSED_MAX_TAPS` taps.
    """
    attrs = {**get_op("MaxPool").attrs, **pool.attrs}
    if len(oshape) != 4 or tuple(low.values[pool.inputs[0]].shape) != tuple(oshape):
        raise NotFusable("a fused MaxPool is 2-D, over the Conv's output")
    pw = window_of(attrs, oshape, tuple(attrs["kernel_shape"]), low.values[pool.outputs[0]].shape)
    if pw.hp != pw.h or pw.wp != pw.w:
        raise NotFusable("a fused MaxPool's windows lie inside the conv's output (no pads, no ceil_mode overhang)")
    if pw.kh * pw.kw > POOL_FUSED_MAX_TAPS:
        raise NotFusable(f"a fused MaxPool has at most {POOL_FUSED_MAX_TAPS} taps")
    return pw


@dataclass(frozen=True)
class Fill:
    """How the packed kernel's input copy computes an element (see :func:`_packed_body`).

    ``rows``: statements run per input row (locals ``n``, ``ci``, ``ih``), ``chan``: per image and
    input channel (``n``, ``ci``), ``elem``: per element (``COL``: its column in the row), and
    ``value``: the element the Conv reads. Without a prologue that is the input's own element.
    """

    rows: list[str]
    chan: list[str]
    elem: list[str]
    value: str


def _prologue_fill(low: Lowered, pro: Sequence[Node], x: str, full: Sequence[str], chan: Sequence[str],
                   views: Mapping[str, Shape], an: Mapping[str, str], nc: tuple[int, int], dtype: str,
                   approx: bool) -> Fill:
    """The input copy of a kernel with a prologue: each element the Conv reads is the prologue
    applied to the inputs' elements at its position, computed as it is copied."""
    var: dict[str, str] = {s: literal(val, low.values[s].dtype) for s, val in low.scalars.items()}
    rows, elem, loads = [], [], []
    for k, v in enumerate(full):
        rows.append(f"xi{k} = {an[v]}[n, ci, ih]")
        var[v] = f"r_{an[v]}"
        elem.append(f"r_{an[v]} = xi{k}[COL]")
    for v in chan:
        idx = [i if d != 1 or f == 1 else "0" for i, d, f in zip(("n", "ci"), views[v], nc, strict=True)]
        loads.append(f"c_{an[v]} = {an[v]}[{', '.join(idx)}]")
        var[v] = f"c_{an[v]}"
    per_channel = set(chan)  # values with one element per image and channel
    for i, n in enumerate(pro):
        operands = [var[i_] for i_ in n.inputs]
        if n.op in _COMMUTATIVE:
            operands.sort()
        expr = scalar_expr(n.op, operands, {**get_op(n.op).attrs, **n.attrs}, lambda c: literal(c, dtype),
                           dtype, approx)
        var[n.outputs[0]] = f"p{i}"
        if all(i_ in per_channel or i_ in low.scalars for i_ in n.inputs):
            per_channel.add(n.outputs[0])
            loads.append(f"p{i} = {expr}")  # once per image and channel (a squeeze-and-excite gate)
        else:
            elem.append(f"p{i} = {expr}")
    return Fill(rows, loads, elem, var[x])


def _prologue(low: Lowered, pro: Sequence[Node], conv: Node, epi: Sequence[Node],
              outputs: Sequence[str]) -> tuple[list[str], list[str], dict[str, Shape]]:
    """The prologue's inputs, checked (:func:`_prologue_fill` writes its statements).

    Returns:
        The full-shape inputs (read row by row, as the Conv's input would be), the per-channel
        inputs (one value per image and channel, or per channel), and every input's view.

    Raises:
        NotFusable: a prologue the packed kernel's copy cannot run.
    """
    x = conv.inputs[0]
    xshape = low.values[x].shape
    dtype = low.values[x].dtype
    made = {o for n in pro for o in n.outputs}
    if len(xshape) != 4:
        raise NotFusable("a Conv prologue needs a 2-D conv")
    for n in pro:
        for o in n.outputs:
            view = _epilogue_view(low.values[o].shape, xshape)
            if low.values[o].dtype != dtype or view is None or (low.values[o].shape != xshape and view[2] != 1):
                raise NotFusable("a Conv prologue is elementwise over the Conv's input (or per channel), in its dtype")
    if any(o in made for o in outputs) or any(i in made for n in epi for i in n.inputs):
        raise NotFusable("a Conv prologue's values are read by the Conv alone")
    ins = [v for v in dict.fromkeys(i for n in pro for i in n.inputs) if v not in made and v not in low.scalars]
    if any(v in conv.inputs or any(v in n.inputs for n in epi) for v in ins):
        raise NotFusable("a Conv prologue's inputs are not read by the Conv or its epilogue")
    full: list[str] = []
    chan: list[str] = []
    views: dict[str, Shape] = {}
    for v in ins:
        shape = low.values[v].shape
        view = _epilogue_view(shape, xshape)
        if low.values[v].dtype != dtype or view is None:
            raise NotFusable(f"prologue input {v} {shape} is not the Conv input's shape or per channel")
        if tuple(shape) == tuple(xshape):
            full.append(v)
            views[v] = tuple(xshape)
        elif view[2] == 1:
            chan.append(v)
            views[v] = view[:2]
        else:
            raise NotFusable(f"prologue input {v} {shape} is not the Conv input's shape or per channel")
    if not full:
        raise NotFusable("a Conv prologue reads a tensor of the Conv input's shape")
    return full, chan, views


def generate_conv_kernel(
    low: Lowered,
    inputs: Sequence[str],
    outputs: Sequence[str],
    name: str,
    schedule: Mapping[str, Any] | None = None,
    approx: bool = False,
) -> KernelSource:
    """Generate Conv (+ bias) + elementwise epilogue as one kernel.

    Args:
        low: the group's nodes and constants.
        inputs: external values read; outputs: values written.
        name: the function name.
        schedule: ``conv_algo`` (:data:`CONV_ALGOS`), ``conv_rows`` (output rows per block, 0:
            each algorithm's own sizing) and ``conv_orient`` ("rows" | "lanes": the packed
            kernel's layout, else :func:`plan_packed` decides), ``conv_block`` (its register block,
            ``"<mr>x<nv>"``; a benchmark's hint, no split point); ``concat_into``,
            ``concat_offset`` and ``concat_channels`` (ConvConcatFusionPass): the one output is
            written as channels ``[offset, offset + M)`` of that Concat's ``(N, channels, ...)``
            output, whose buffer is the kernel's output argument.
        approx: the epilogue's transcendentals as numerics.py's approximations.

    Raises:
        NotFusable: not exactly one Conv, a 3-D conv, mixed or unsupported dtypes, an epilogue op
            that is not elementwise over the conv output, or a value the kernel cannot index.
        ValueError: an unknown ``conv_algo``.
    """
    schedule = schedule or {}
    pool = _find_pool(low, outputs)
    final = outputs[0]
    if pool is not None:
        outputs = [pool.inputs[0]]  # the epilogue's result, which the pool reads from the block
    conv, pro, epi = _find_conv(low, pool)
    x, w = conv.inputs[0], conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) == 3 else None
    y = conv.outputs[0]
    oshape = low.values[y].shape
    dtype = low.values[y].dtype
    if low.values[x].dtype != dtype or low.values[w].dtype != dtype or dtype not in ("float32", "float64"):
        raise NotFusable("Conv needs float32 or float64 operands of one dtype")
    if bias is not None and low.values[bias].dtype != dtype:
        raise NotFusable("Conv bias must have the operands' dtype")
    attrs = {**get_op("Conv").attrs, **conv.attrs}
    wshape = low.values[w].shape
    win = window_of(attrs, low.values[x].shape, wshape[2:], oshape)
    group = int(attrs.get("group", 1))
    M = wshape[0]
    CG, MG = win.c // group, M // group
    K = CG * win.kh * win.kw
    P = win.oh * win.ow
    shape_kw = {"strided": (win.sh, win.sw) != (1, 1),
                "padded": any((win.ph, win.pw, win.pe_h, win.pe_w)), "prologue": bool(pro)}
    algo = schedule.get("conv_algo") or choose_conv_algo(CG, MG, win.kh, win.kw, group, P, **shape_kw)
    pw: Window | None = None
    if pool is not None:
        pw = _pool_window(low, pool, win, oshape)
        if P * MG * np.dtype(dtype).itemsize > POOL_FUSED_MAX_BYTES:
            raise NotFusable(f"a conv plane of {P} x {MG} is too large for its MaxPool's block")
        if win.n * group < task_threads(True):
            raise NotFusable("a conv with a MaxPool runs a task per image and group: fewer than the threads")
        algo = "packed"  # whatever a schedule asks: the pool reads the packed kernel's whole block
    P_out = pw.oh * pw.ow if pw is not None else P
    if algo not in CONV_ALGOS:
        raise ValueError(f"schedule conv_algo={algo!r}: expected one of {CONV_ALGOS}")
    pro_full: list[str] = []
    pro_chan: list[str] = []
    pro_views: dict[str, Shape] = {}
    if pro:
        if "conv_algo" not in schedule and algo != "packed":
            raise NotFusable(f"a Conv prologue runs in the packed kernel's input copy ({algo} makes none)")
        algo = "packed"  # whatever a schedule asks: only the packed kernel copies its input
        pro_full, pro_chan, pro_views = _prologue(low, pro, conv, epi, outputs)
    if algo == "chan" and not (CG == 1 and MG == 1):
        algo = "direct"  # channels-last needs one input and one output channel per group
    if algo == "shifted" and (win.sh, win.sw) != (1, 1):
        algo = "im2col"  # the shifted views need unit stride; a schedule asking for it gets im2col
    if algo == "axpy" and not axpy_applies(win.kh, win.kw, group, **shape_kw):
        algo = "packed"  # a schedule asking for axpy on another conv gets packed

    for n in epi:
        for v in (*n.inputs, *n.outputs):
            if v not in low.scalars and _epilogue_view(low.values[v].shape, oshape) is None:
                raise NotFusable(f"epilogue value {v} {low.values[v].shape} does not broadcast to {oshape}")
    for o in outputs:
        if low.values[o].shape != oshape:
            raise NotFusable(f"output {o} is not of the Conv's shape")
    # ConvConcatFusionPass: the one output is channels [off, off + M) of a Concat's output
    into = schedule.get("concat_into")
    if into is not None:
        if len(outputs) != 1 or low.values[outputs[0]].dtype != dtype:
            raise NotFusable("a conv writes into a Concat's output only as its one output, of its dtype")
        into_off, into_m = int(schedule["concat_offset"]), int(schedule["concat_channels"])
        if not 0 <= into_off <= into_off + M <= into_m:
            raise NotFusable(f"channels {into_off}..{into_off + M} do not lie in the Concat's {into_m}")
    operands = {x, w} | ({bias} if bias else set()) | set(pro_views)
    ext = [v for v in inputs if v not in operands]
    operand_reads = [v for v in dict.fromkeys(conv.inputs) if any(v in n.inputs for n in epi)]
    epi_key = {v: f"{v}#epilogue" for v in operand_reads}
    views: dict[str, Shape] = {x: (win.n, win.c, win.h, win.w), **pro_views}
    views[w] = (group, MG, K) if algo == "im2col" else (M, CG, win.kh, win.kw)
    if bias is not None:
        views[bias] = (M,)
    for v in (*ext, *operand_reads, *outputs):
        view = _epilogue_view(low.values[v].shape, oshape)
        if view is None:
            raise NotFusable(f"epilogue array {v} {low.values[v].shape} has no view over {oshape}")
        views[epi_key.get(v, v)] = view
    args = [ArgSpec(v, views[v], low.values[v].dtype, "in") for v in inputs]
    args += [ArgSpec(v, views[epi_key[v]], low.values[v].dtype, "in") for v in operand_reads]
    args += [ArgSpec(v, views[v], low.values[v].dtype, "out") for v in outputs]
    if pool is not None:  # the kernel stores the pool's output; the conv's stays in the block
        args[-1] = ArgSpec(final, (win.n, M, P_out), dtype, "out")
    out_bytes = int(np.prod(args[-1].shape)) * np.dtype(dtype).itemsize
    if into is not None:
        args[-1] = ArgSpec(into, (win.n, into_m, P_out), dtype, "out")
    keys = [*inputs, *(epi_key[v] for v in operand_reads), *outputs]
    an = {k: f"a{i}" for i, k in enumerate(keys)}

    full = (win.n, M, P)

    def at(key: str) -> str:
        # index 0 only along a broadcast dimension: a batch of one reads n (always 0) like any
        # other batch, so that its kernel is the other batches' kernel
        i = [v if d != 1 or f == 1 else "0" for v, d, f in zip("nmp", views[key], full, strict=True)]
        if pool is not None and key == outputs[0]:
            return f"blk[{_ix('q')}, mm]"  # back into the block, where the pool reads it
        if into is not None and key == outputs[0]:
            i[1] = f"m + {into_off}"
        return f"{an[key]}[{', '.join(i)}]"

    # The epilogue, as statements over locals; `acc` holds the conv result element at (n, m, p).
    var: dict[str, str] = {s: literal(val, low.values[s].dtype) for s, val in low.scalars.items()}
    var[y] = "acc"
    body: list[str] = []
    if bias is not None:
        body.append(f"acc = acc + {an[bias]}[m]")
    reads = {i for n in epi for i in n.inputs}
    for v in ext:
        if v in reads and v not in low.scalars:
            var[v] = f"e_{an[v]}"
            body.append(f"{var[v]} = {at(v)}")
    for v in operand_reads:
        var[v] = f"e_{an[epi_key[v]]}"
        body.append(f"{var[v]} = {at(epi_key[v])}")
    for i, n in enumerate(epi):
        dt = low.values[n.outputs[0]].dtype
        lit_dt = dt if dt != "bool" else dtype
        var[n.outputs[0]] = f"v{i}"
        operands = [var[i_] for i_ in n.inputs]
        if n.op in _COMMUTATIVE:  # one source whichever operand order the exporter wrote
            operands.sort()
        expr = scalar_expr(n.op, operands, {**get_op(n.op).attrs, **n.attrs},
                           lambda c, d=lit_dt: literal(c, d), dt, approx)
        body.append(f"v{i} = {expr}")
    for o in outputs:
        body.append(f"{at(o)} = {var[o]}")
    # The tail runs over the output's flat elements: not over another kernel's channels.
    tail = None if into is not None or pool is not None else _transcendental_tail(epi, y, low, outputs, var, body, at, dtype)

    # A plane kernel runs a depthwise conv at 3 to 6 GMAC/s, against 100 and more for the dense
    # algorithms, so it pays for a parallel region at 8x fewer MACs. Measured with 2 threads,
    # parallel against serial: dw3x3 s2 48 @32 n2 (221k MACs) 24 against 41 us, dw3x3 24 @32
    # (221k) 17 against 27, dw5x5 s2 48 @16 (77k) 9.9 against 11.8. The direct kernel did not
    # gain (dw5x5 192 @4 n2: 57 us parallel, 28 serial).
    parallel = win.n * M * P * K >= PARALLEL_MIN_ELEMENTS * (1 if algo == "plane" else DENSE_PARALLEL_FACTOR)
    derived: tuple[Derived, ...] = ()
    params: tuple[int, ...] = ()
    lines = [decorator(args, parallel=parallel, reassoc=False), f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}):"]
    ax, aw = an.get(x, ""), an[w]
    fill = Fill([f"xi0 = {ax}[n, ci, ih]"], [], [], "xi0[COL]")
    if pro:
        fill = _prologue_fill(low, pro, x, pro_full, pro_chan, pro_views, an, (win.n, win.c), dtype, approx)
    if algo != "packed":
        # The output row width as a value LLVM cannot see (module docstring, "Index arithmetic").
        lines.append(f"    ow_n = {an[outputs[0]]}.shape[2] // {win.oh}")
    if algo == "im2col":
        rows = int(schedule.get("conv_rows", 0)) or _im2col_rows(win, K, group, np.dtype(dtype).itemsize, parallel)
        lines += _im2col_body(win, group, CG, MG, K, min(rows, win.oh), dtype, ax, aw, body, parallel)
        imports = ["from fusiontune.codegen.blas import gemm32, gemm64"]
    elif algo == "shifted":
        wp = win.w + win.pw + win.pe_w
        rows = int(schedule.get("conv_rows", 0)) or _shifted_rows(win, wp, group, parallel)
        lines += _shifted_body(win, group, CG, MG, min(rows, win.oh), wp, dtype, ax, aw, body, parallel)
        imports = ["from fusiontune.codegen.blas import gemm_at32, gemm_at64"]
    elif algo == "packed":
        # with a MaxPool: channels in the lanes, so the pool runs over rows of channels, and
        # every output row in one task, so every window lies in the task's block
        orient = "lanes" if pool is not None else schedule.get("conv_orient")
        plan = plan_packed(win, MG, dtype, orient, CG, schedule.get("conv_block"))
        uk = plan.uk
        geo = packed_geometry(win, max(uk.mr, uk.nr))
        rows = int(schedule.get("conv_rows", 0)) or _packed_rows(win, geo, CG, MG, group, np.dtype(dtype).itemsize, parallel)
        if pool is not None:
            rows = win.oh
        if w in low.arrays and w not in operand_reads:  # a constant: packed once when the program is built
            packed = Derived(f"{w}#packed{plan.block}", w, "fusiontune.codegen.conv:pack_weights", (group, plan.block))
            derived = (packed,)
            shape = (group, -(-MG // plan.block), win.kh * win.kw, CG, plan.block)
            args = [ArgSpec(packed.value, shape, dtype, "in") if a.value == w else a for a in args]
        lines[0] = decorator(args, parallel=parallel, reassoc=False, params=True)
        lines[1] = f"def {name}({', '.join(f'a{i}' for i in range(len(args)))}, prm):"
        packed_lines, params = _packed_body(win, geo, group, CG, MG, min(rows, win.oh), plan, fill, aw,
                                            body if tail is None else tail.head, parallel, bool(derived),
                                            in_block=pool is not None)
        if tail is not None:
            packed_lines += _tail_over_rows(tail, "k_group", "k_mg", "k_oh", "k_ow")
        if pw is not None:
            packed_lines += _pool_lines(win, pw, an[outputs[0]], dtype, into_off if into is not None else 0)
        lines += packed_lines
        # imported by its full name, so that the kernel cache key covers microkernel.py
        imports = ["from fusiontune.codegen.microkernel import dispatcher, rows_copy",
                   f"uk = dispatcher({dtype!r})", f"rcp = rows_copy({dtype!r})"]
    elif algo == "plane":
        lines += _plane_body(win, group, CG, MG, dtype, ax, aw, body, parallel, tail)
        imports = []
    elif algo == "chan":
        if w in low.arrays and w not in operand_reads:  # a constant: packed once when the program is built
            lanes = microkernel.lanes(dtype)
            packed = Derived(f"{w}#chan{lanes}", w, "fusiontune.codegen.conv:pack_depthwise", (lanes,))
            derived = (packed,)
            blocks = (-(-group // lanes), win.kh * win.kw, lanes)
            args = [ArgSpec(packed.value, blocks, dtype, "in") if a.value == w else a for a in args]
            lines[0] = decorator(args, parallel=parallel, reassoc=False)
        lines += _chan_body(win, group, dtype, ax, aw, body, parallel, tail, bool(derived))
        # imported by its full name, so that the kernel cache key covers microkernel.py
        # only the micro-kernel the body calls: each is an LLVM compile on the process's first use
        taps_kernel = (f"dwr = depthwise_rows({dtype!r}, {win.kw}, {win.sw}, {win.dw})" if chan_by_rows(win)
                       else f"dwk = depthwise({dtype!r})")
        imports = ["from fusiontune.codegen.microkernel import depthwise, depthwise_rows, transpose_in",
                   taps_kernel, f"dw_in = transpose_in({dtype!r})"]
    elif algo == "axpy":
        # multiply-adds, as the micro-kernel's: half the instructions of a product and a sum
        lines[0] = decorator(args, parallel=parallel, reassoc=False, contract=True)
        lines += _axpy_body(win, M, dtype, ax, aw, body, parallel, tail)
        imports = []
    else:
        lines += _direct_body(win, group, CG, MG, dtype, ax, aw, body, parallel, tail)
        imports = []
    code = "\n".join(lines) + "\n"
    code = code.replace("IX(", "(" if any(_LIBM_CALL.search(b) for b in (*body, *fill.elem)) else "numba.uint64(")
    source = kernel_header(code, imports) + code
    nbytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in args)
    if into is not None:  # it writes its own channels of the Concat's output, not all of them
        nbytes += out_bytes - int(np.prod(args[-1].shape)) * np.dtype(dtype).itemsize
    flops = 2 * win.n * M * P * K + win.n * M * P * (len(epi) + (bias is not None))
    flops += win.n * win.c * win.h * win.w * len(pro)
    if pw is not None:
        flops += win.n * M * P_out * pw.kh * pw.kw
    return KernelSource(name, source, tuple(args), "conv", nbytes, flops, derived, params)


def _im2col_rows(win: Window, k: int, group: int, itemsize: int, parallel: bool) -> int:
    """Output rows per im2col block: the patch matrix within :data:`COL_BYTES`, and, in a
    parallel kernel, enough blocks to keep every thread busy."""
    rows = max(1, COL_BYTES // max(1, k * win.ow * itemsize))
    threads = task_threads(parallel)
    tasks = win.n * group
    if tasks < 2 * threads:
        rows = min(rows, max(1, -(-win.oh // -(-2 * threads // tasks))))
    return rows


def _epilogue_lines(body: Sequence[str], indent: str) -> list[str]:
    return [indent + s for s in body]


@dataclass(frozen=True)
class Tail:
    """The end of an epilogue that reads nothing but one value of its own and holds a
    transcendental (a SiLU's sigmoid and product after the bias): a kernel whose epilogue runs
    over a few positions per channel runs it instead as one flat loop over the output, where it
    vectorizes. ``head``: the epilogue up to that value, stored in the output; ``lines``: the rest,
    from ``value`` (a local read back from the output) to ``result``, stored over it."""

    head: list[str]
    lines: list[str]
    value: str
    result: str
    out: str  # the output array


def _tail_loop(tail: Tail, i0: str, i1: str) -> list[str]:
    """A task's :class:`Tail` over the output's elements ``i0`` to ``i1`` (flat indices)."""
    return [
        f"        o_flat = {tail.out}.reshape({tail.out}.size)",
        f"        for i in range({i0}, {i1}):",
        f"            {tail.value} = o_flat[numba.uint64(i)]",
        *_epilogue_lines(tail.lines, "            "),
        f"            o_flat[numba.uint64(i)] = {tail.result}",
    ]


def _tail_over_rows(tail: Tail, group: str, mg: str, oh: str, ow: str) -> list[str]:
    """A task's :class:`Tail` over the output rows ``r0`` to ``r1`` of its image ``n`` and group
    ``g``: one loop over all its channels when it holds whole planes (they follow one another in
    the output), else one per channel."""
    return [
        f"        o_flat = {tail.out}.reshape({tail.out}.size)",
        f"        run = (r1 - r0) * {ow}",
        f"        whole = run == {oh} * {ow}",
        f"        for mm in range(1 if whole else {mg}):",
        f"            i0 = ((n * {group} + g) * {mg} + mm) * ({oh} * {ow}) + r0 * {ow}",
        f"            for i in range(i0, i0 + ({mg} * run if whole else run)):",
        f"                {tail.value} = o_flat[numba.uint64(i)]",
        *_epilogue_lines(tail.lines, "                "),
        f"                o_flat[numba.uint64(i)] = {tail.result}",
    ]


def _transcendental_tail(epi: Sequence[Node], y: str, low: Lowered, outputs: Sequence[str],
                         var: Mapping[str, str], body: Sequence[str], at: Callable[[str], str],
                         dtype: str) -> Tail | None:
    """``body`` (the epilogue's statements: the bias, the loads, one per op of ``epi``, then the
    stores) split before its last run of ops that read only values the epilogue computed (no
    array, no other input), when that run holds a transcendental and reads one value from
    before it; None when there is no such run, or the kernel writes more than one output."""
    if len(outputs) != 1 or low.values[outputs[0]].dtype != dtype:
        return None
    own = {y} | {o for n in epi for o in n.outputs}
    reads_array = [i for i, n in enumerate(epi) if any(v not in own and v not in low.scalars for v in n.inputs)]
    cut = reads_array[-1] + 1 if reads_array else 0
    rest = epi[cut:]
    made = {o for n in rest for o in n.outputs}
    before = {v for n in rest for v in n.inputs if v in own and v not in made}
    if not rest or outputs[0] not in made or len(before) != 1 or not any(n.op in EXPENSIVE for n in rest):
        return None
    (value,) = before
    if low.values[value].dtype != dtype:
        return None
    first = len(body) - len(outputs) - len(epi)  # the statement of epi[0]
    return Tail(head=[*body[:first + cut], f"{at(outputs[0])} = {var[value]}"],
                lines=list(body[first + cut:first + len(epi)]), value=var[value], result=var[outputs[0]],
                out=at(outputs[0]).split("[", 1)[0])


def _im2col_body(win: Window, group: int, cg: int, mg: int, k: int, rows: int, dtype: str, ax: str, aw: str,
                 body: Sequence[str], parallel: bool) -> list[str]:
    nblk = -(-win.oh // rows)
    prange = "numba.prange" if parallel else "range"
    gemm = gemm_name(dtype)
    out = [
        f"    for t in {prange}({win.n * group * nblk}):",
        f"        n = t // {group * nblk}",
        f"        g = (t // {nblk}) % {group}",
        f"        r0 = (t % {nblk}) * {rows}",
        f"        r1 = min(r0 + {rows}, {win.oh})",
        f"        pl = (r1 - r0) * {win.ow}",
        f"        col = np.empty(({k}, pl), dtype=np.{dtype})",
        f"        for c in range({cg}):",
        f"            ci = g * {cg} + c",
        f"            for kh in range({win.kh}):",
        f"                for kw in range({win.kw}):",
        f"                    kk = (c * {win.kh} + kh) * {win.kw} + kw",
        *col_range(win, "                    "),
        "                    for oh in range(r0, r1):",
        f"                        ih = oh * {win.sh} - {win.ph} + kh * {win.dh}",
        f"                        q = (oh - r0) * {win.ow}",
        f"                        if ih < 0 or ih >= {win.h}:",
        f"                            for ow in range({win.ow}):",
        "                                col[kk, q + ow] = 0.0",
        "                        else:",
        "                            for ow in range(lo):",
        "                                col[kk, q + ow] = 0.0",
        "                            for ow in range(lo, hi):",
        f"                                col[kk, q + ow] = {ax}[n, ci, ih, ow * {win.sw} + off]",
        f"                            for ow in range(hi, {win.ow}):",
        "                                col[kk, q + ow] = 0.0",
        f"        blk = np.empty(({mg}, pl), dtype=np.{dtype})",
        f"        {gemm}({aw}[g], col, blk)",
        f"        p0 = r0 * {win.ow}",
        f"        for mm in range({mg}):",
        f"            m = g * {mg} + mm",
        "            for q in range(pl):",
        f"                p = {_ix('p0 + q')}",
        "                acc = blk[mm, q]",
        *_epilogue_lines(body, "                "),
    ]
    return out


def _grid_epilogue(mg: int | str, wp: int | str, ow: int | str, body: Sequence[str]) -> list[str]:
    """The epilogue of a task whose block ``blk`` holds ``mg`` channels by the grid positions of
    output rows ``r0 <= oh < r1`` (row stride ``wp``, output row width ``ow``; the ``wp - ow`` pad
    columns dropped). Each size is a constant or the name of a local."""
    return [
        f"        for mm in range({mg}):",
        f"            m = g * {mg} + mm",
        "            for oh in range(r0, r1):",
        f"                q = (oh - r0) * {wp}",
        "                for ow in range(ow_n):",
        f"                    p = {_ix(f'oh * {ow} + ow')}",
        f"                    acc = blk[mm, {_ix('q + ow')}]",
        *_epilogue_lines(body, "                    "),
    ]


def _shifted_rows(win: Window, wp: int, group: int, parallel: bool) -> int:
    """Output rows per shifted (or packed) block: about :data:`SHIFT_POSITIONS` padded-width
    positions, rows spread evenly over the blocks, and, in a parallel kernel, enough blocks to keep
    every thread busy. A serial kernel cut for threads it does not use paid for it: SqueezeNet's
    1x1 and 3x3 convs at 3x3 outputs, cut into two blocks of two rows (halo included) for two
    threads, ran 1.6-1.8x slower than as one block (fused_node_conv2d_22: 3.4 against 2.0 us).
    A parallel kernel on one thread still takes two blocks here, unlike the packed kernel's
    (:func:`_packed_rows`): the shifted GEMMs measured both ways, one thread, two blocks against
    one: 3x3 256 @14 1.06x, 32 @12 1.06x, but 64 @16 0.79x."""
    return _spread_rows(win, max(1, -(-win.oh * wp // SHIFT_POSITIONS)), win.n * group, task_threads(parallel))


def _spread_rows(win: Window, nblk: int, tasks: int, threads: int) -> int:
    """Rows per block for ``nblk`` blocks of ``win``'s output rows, spread evenly, and at least two
    tasks per thread among ``tasks`` images and groups (none asked for with ``threads`` 0)."""
    if tasks * nblk < 2 * threads:
        nblk = max(nblk, -(-2 * threads // tasks))
    return max(1, -(-win.oh // min(nblk, win.oh)))


def _packed_rows(win: Window, geo: PackedGeometry, cg: int, mg: int, group: int, itemsize: int,
                 parallel: bool) -> int:
    """Output rows per packed task: as many as keep the task's phase planes and its output block
    within :data:`PACKED_PLANES_SHARE` of the core's L2 (:func:`~fusiontune.codegen.target.l2_bytes`),
    or, where the group's weights outweigh the planes and output of the whole conv, within
    :data:`PACKED_WEIGHT_HEAVY_BYTES` (at most the L2), rows spread evenly over the blocks, and,
    in a kernel run on several threads, enough blocks to keep every thread busy.

    Each task streams all of its group's weights once, so every block more reads them again (3x3
    512->512 @7: 9.4 MB a pass, cut in two blocks for threads the kernel did not have, 0.82x
    onnxruntime on one thread, 0.94x-1.01x in one block); planes past L2 are read from L3 once per
    channel block (3x3 s2 128->128 @56 at 14 rows, 0.96 MB of planes: 0.77x; at 7 rows: 0.91x).
    """
    per_row = (len(geo.phases) * cg + mg) * geo.wp * itemsize
    fixed = len(geo.phases) * cg * (geo.halo * geo.wp + geo.slack) * itemsize
    weights = win.kh * win.kw * cg * mg * itemsize
    l2 = target.l2_bytes()
    if weights >= fixed + per_row * win.oh:  # weight-heavy: fewer blocks, each streams them all
        budget = min(l2, max(PACKED_WEIGHT_HEAVY_BYTES, int(l2 * PACKED_PLANES_SHARE)))
    else:
        budget = int(l2 * PACKED_PLANES_SHARE)
    rows = max(1, min(win.oh, (budget - fixed) // per_row))
    threads = task_threads(parallel)
    return _spread_rows(win, -(-win.oh // rows), win.n * group, threads if threads > 1 else 0)


def _shifted_body(win: Window, group: int, cg: int, mg: int, rows: int, wp: int, dtype: str, ax: str, aw: str,
                  body: Sequence[str], parallel: bool) -> list[str]:
    """Stride-1 conv as kh*kw GEMMs over shifted views of the zero-padded input, no patch copy.

    On the padded grid (width ``wp``), output position ``j = oh * wp + ow`` reads input position
    ``j + kh * dh * wp + kw * dw`` for tap (kh, kw), for every channel: so the taps' (C, positions)
    operands are the one padded block at different offsets (row stride ``cs``), and
    ``blk = sum over taps of W[:, :, kh, kw] @ view``. The ``wp - ow`` columns past each output
    row are computed and dropped (a read past a padded row lands in the next row or the slack).
    """
    nblk = -(-win.oh // rows)
    prange = "numba.prange" if parallel else "range"
    gemm = {"float32": "gemm_at32", "float64": "gemm_at64"}[dtype]
    isz = np.dtype(dtype).itemsize
    taps = win.kh * win.kw
    halo = (win.kh - 1) * win.dh
    slack = (win.kw - 1) * win.dw
    # A 1x1 conv without padding reads the input in place: its (C, positions) operand is a slice.
    in_place = win.kh == win.kw == 1 and win.ph == win.pw == win.pe_h == win.pe_w == 0
    out = [
        f"    wt = np.empty(({group}, {taps}, {mg}, {cg}), dtype=np.{dtype})",
        f"    for gm in {prange}({group * mg}):",
        f"        for c in range({cg}):",
        f"            for i in range({win.kh}):",
        f"                for j in range({win.kw}):",
        f"                    wt[gm // {mg}, i * {win.kw} + j, gm % {mg}, c] = {aw}[gm, c, i, j]",
        f"    for t in {prange}({win.n * group * nblk}):",
        f"        n = t // {group * nblk}",
        f"        g = (t // {nblk}) % {group}",
        f"        r0 = (t % {nblk}) * {rows}",
        f"        r1 = min(r0 + {rows}, {win.oh})",
        f"        pl = (r1 - r0) * {wp}",
        f"        blk = np.empty(({mg}, pl), dtype=np.{dtype})",
    ]
    if in_place:
        out += [
            f"        src = {ax}.ctypes.data + ((n * {win.c} + g * {cg}) * {win.h * win.w} + r0 * {win.w}) * {isz}",
            f"        {gemm}({mg}, pl, {cg}, wt[g, 0].ctypes.data, {cg}, src, {win.h * win.w}, blk.ctypes.data, pl, 0.0)",
        ]
    else:
        out += [
            f"        nr = r1 - r0 + {halo}",
            f"        cs = nr * {wp} + {slack}",
            f"        xp = np.empty(({cg}, cs), dtype=np.{dtype})",
            f"        for c in range({cg}):",
            f"            ci = g * {cg} + c",
            "            for i in range(nr):",
            f"                ih = r0 + i - {win.ph}",
            f"                q = i * {wp}",
            f"                if ih < 0 or ih >= {win.h}:",
            f"                    for u in range({wp}):",
            "                        xp[c, q + u] = 0.0",
            "                else:",
            f"                    for u in range({win.pw}):",
            "                        xp[c, q + u] = 0.0",
            f"                    for u in range({win.w}):",
            f"                        xp[c, q + {win.pw} + u] = {ax}[n, ci, ih, u]",
            f"                    for u in range({win.pw + win.w}, {wp}):",
            "                        xp[c, q + u] = 0.0",
            f"            for u in range(nr * {wp}, cs):",
            "                xp[c, u] = 0.0",
            f"        for tap in range({taps}):",
            f"            sh = (tap // {win.kw}) * {win.dh * wp} + (tap % {win.kw}) * {win.dw}",
            f"            {gemm}({mg}, pl, {cg}, wt[g, tap].ctypes.data, {cg}, xp.ctypes.data + sh * {isz}, cs,"
            " blk.ctypes.data, pl, 0.0 if tap == 0 else 1.0)",
        ]
    return out + _grid_epilogue(mg, wp, win.ow, body)


DIRECT_TASK_OUTPUTS = 2048
"""Output elements a direct task computes at least (rows of several channels): a task costs
about 0.1 us to start (scratch row, index arithmetic), measured as most of a 16x16 depthwise
layer's time when every task was one output row."""


DIRECT_EPILOGUE_RUN = 32
"""Output positions a direct unit holds at least (whole rows): its epilogue then runs over that
many contiguous positions. Per row, a depthwise 5x5 192 @4x4 with a SiLU epilogue took 30 us
against 12 without the SiLU: a 4-wide row left exp_f32 scalar."""


def _direct_body(win: Window, group: int, cg: int, mg: int, dtype: str, ax: str, aw: str,
                 body: Sequence[str], parallel: bool, tail: Tail | None = None) -> list[str]:
    """One unit per (image, group, block of :data:`DIRECT_MB` output channels, block of output
    rows holding at least :data:`DIRECT_EPILOGUE_RUN` positions): it accumulates each row over
    the input channels and taps (inner loop over the output row), then applies the epilogue to
    the block's rows as one run. Units are dealt to tasks in runs of at least
    :data:`DIRECT_TASK_OUTPUTS` outputs, with one scratch block per task.

    With a transcendental ``tail`` and whole planes per unit, a task's units write their
    epilogue's head, and the tail runs once over the task's outputs, a contiguous run: over the
    few positions of one channel it ran scalar (dw3x3 288 @2 n2 with a SiLU: 18.5 us, 4.3 without
    the SiLU)."""
    mb = min(DIRECT_MB, mg)
    mblk = -(-mg // mb)
    rows = min(win.oh, max(1, -(-DIRECT_EPILOGUE_RUN // win.ow)))
    rblk = -(-win.oh // rows)
    prange = "numba.prange" if parallel else "range"
    units = win.n * group * mblk * rblk
    threads = task_threads(parallel)
    per = max(1, min(-(-DIRECT_TASK_OUTPUTS // (mb * rows * win.ow)), -(-units // (2 * threads))))
    ntask = -(-units // per)
    flat = tail if rblk == 1 else None
    return [
        f"    for t in {prange}({ntask}):",
        f"        acc_blk = np.empty(({mb}, {rows * win.ow}), dtype=np.{dtype})",
        f"        for v in range(t * {per}, min((t + 1) * {per}, {units})):",
        f"            oh0 = (v % {rblk}) * {rows}",
        f"            oh1 = min(oh0 + {rows}, {win.oh})",
        f"            u = v // {rblk}",
        f"            m0 = (u % {mblk}) * {mb}",
        f"            u = u // {mblk}",
        f"            g = u % {group}",
        f"            n = u // {group}",
        f"            nm = min({mb}, {mg} - m0)",
        "            acc_blk[:] = 0.0",
        "            for oh in range(oh0, oh1):",
        f"                q0 = (oh - oh0) * {win.ow}",
        f"                for c in range({cg}):",
        f"                    ci = g * {cg} + c",
        f"                    for kh in range({win.kh}):",
        f"                        ih = oh * {win.sh} - {win.ph} + kh * {win.dh}",
        f"                        if ih < 0 or ih >= {win.h}:",
        "                            continue",
        f"                        for kw in range({win.kw}):",
        *col_range(win, "                            "),
        "                            for j in range(nm):",
        f"                                wv = {aw}[g * {mg} + m0 + j, c, kh, kw]",
        "                                for ow in range(lo, hi):",
        f"                                    acc_blk[j, numba.uint64(q0 + ow)] += wv * {ax}[n, ci, ih, ow * {win.sw} + off]",
        "            run = (oh1 - oh0) * ow_n",
        "            for j in range(nm):",
        f"                m = g * {mg} + m0 + j",
        "                for q in range(run):",
        f"                    p = {_ix(f'oh0 * {win.ow} + q')}",
        "                    acc = acc_blk[j, q]",
        *_epilogue_lines(body if flat is None else flat.head, "                    "),
        *([] if flat is None else [
            # units in order cover the output in order: (image, channel) planes, channels in blocks
            f"        u0 = t * {per}",
            f"        u1 = min(u0 + {per}, {units})",
            *_tail_loop(flat, f"((u0 // {mblk}) * {mg} + min((u0 % {mblk}) * {mb}, {mg})) * {win.oh * win.ow}",
                        f"((u1 // {mblk}) * {mg} + min((u1 % {mblk}) * {mb}, {mg})) * {win.oh * win.ow}"),
        ]),
    ]


def _axpy_body(win: Window, m_out: int, dtype: str, ax: str, aw: str, body: Sequence[str],
               parallel: bool, tail: Tail | None = None) -> list[str]:
    """A 1x1 conv with a short reduction (:data:`AXPY_MAX_K`) as a sum of scaled input rows: a
    task (image, block of positions) copies its ``K`` input rows of the block into scratch rows
    (a stride of the block plus 16, so that rows 4 KiB apart in the input, 16 of them, do not
    compete for the L1 cache's 12 ways), then for each output channel computes
    ``sum_k w[m, k] * x[k, q]`` over the block in one loop vectorized over ``q``, with the
    weights in registers and the epilogue in the same loop, but for a transcendental ``tail``,
    which runs over the channel's block in a second loop while it is in cache (with a SiLU in the
    first loop, 8 -> 48 channels @32 batch 2 took 135 us on one thread; in the second, 108)."""
    k, P = win.c, win.oh * win.ow
    pb = max(16, min(P, AXPY_BLOCK // k // 16 * 16))
    nblk = -(-P // pb)
    ss = pb + 16
    prange = "numba.prange" if parallel else "range"
    terms = " + ".join(f"w{j} * xs[numba.uint64({j * ss} + q)]" for j in range(k))
    return [
        f"    xf = {ax}.reshape({win.n * k * P})",
        f"    for t in {prange}({win.n * nblk}):",
        # inside the loop, as every tail's: an alias of the output taken outside a prange loop
        # and written through in it lost the loop's stores to the output (numba's parallel
        # lowering; 1x1 16->96 @8x8 with a SiLU: zeros in place of the conv's values)
        *([] if tail is None else [f"        o_flat = {tail.out}.reshape({tail.out}.size)"]),
        f"        n = t // {nblk}",
        f"        p0 = (t % {nblk}) * {pb}",
        f"        pn = min({pb}, {P} - p0)",
        f"        xs = np.empty({k * ss}, dtype=np.{dtype})",
        f"        for c in range(opaque({k})):",
        f"            xb = (n * {k} + c) * {P} + p0",
        "            for q in range(pn):",
        f"                xs[numba.uint64(c * {ss} + q)] = xf[numba.uint64(xb + q)]",
        # the channel loops' counts are opaque to LLVM (numerics.opaque): unrolled whole around
        # their vectorized loops, they took twice as long to compile (MobileNetV3's 24 -> 8 @16:
        # 1.6-1.9 s against 0.8-1.0) and ran no faster
        f"        for m in range(opaque({m_out})):",
        *[f"            w{j} = {aw}[m, {j}, 0, 0]" for j in range(k)],
        "            for q in range(pn):",
        f"                p = {_ix('p0 + q')}",
        f"                acc = {terms}",
        *_epilogue_lines(body if tail is None else tail.head, "                "),
        *([] if tail is None else [
            f"            i0 = (n * {m_out} + m) * {P} + p0",
            "            for i in range(i0, i0 + pn):",
            f"                {tail.value} = o_flat[numba.uint64(i)]",
            *_epilogue_lines(tail.lines, "                "),
            f"                o_flat[numba.uint64(i)] = {tail.result}",
        ]),
    ]


PLANE_TAPS_PER_STATEMENT = 9
"""The plane kernel sums up to this many taps of one phase plane in one statement (13 and 25 were
no faster on 5x5 windows)."""


def _plane_body(win: Window, group: int, cg: int, mg: int, dtype: str, ax: str, aw: str,
                body: Sequence[str], parallel: bool, tail: Tail | None = None) -> list[str]:
    """One unit per (image, group): the group's input planes are copied into zero-padded scratch
    planes (their borders are zeroed once per task), then every output channel of the group sums
    its taps over the whole output plane with no bounds to test, and the epilogue runs over the plane.

    The padded plane is split into ``sh x sw`` phase planes (one at unit stride), as the packed
    kernel's (:class:`PackedGeometry`): phase (a, b) holds padded rows ``a + sh * i`` and columns
    ``b + sw * u`` on a grid of width ``wg = ow + max_kw (kw * dw) // sw``. On that grid output
    position ``oh * wg + ow`` reads, for tap (kh, kw), phase ``((kh * dh) % sh, (kw * dw) % sw)``
    at offset ``(kh * dh) // sh * wg + (kw * dw) // sw``: each tap is one flat run
    (``acc[q] += w * xp[offset + q]``, the ``wg - ow`` extra columns per row computed and
    dropped), one long vectorized loop however small the rows are, at any stride. The copy into
    the phase planes reads the input row at stride ``sw``."""
    rh = max((kh * win.dh) // win.sh for kh in range(win.kh))
    rw = max((kw * win.dw) // win.sw for kw in range(win.kw))
    wg, hq = win.ow + rw, win.oh + rh  # the phase grids' width and the rows the taps read
    size = hq * wg + rw  # the flat run of the last row's taps reads rw past the grid
    nph = win.sh * win.sw
    prange = "numba.prange" if parallel else "range"
    units = win.n * group
    threads = task_threads(parallel)
    per = max(1, min(-(-DIRECT_TASK_OUTPUTS // (mg * win.oh * win.ow)), -(-units // (2 * threads))))
    ntask = -(-units // per)
    # The taps of a statement are summed in registers and the accumulator is loaded and stored
    # once per statement, not once per tap. A statement holds up to PLANE_TAPS_PER_STATEMENT taps
    # (their weights and the sum fit the vector registers) of one phase plane: a 3x3 s2 window
    # over its four phase planes in one statement ran 1.8x slower than tap by tap (measured beside
    # a test run; likely LLVM's run-time alias checks between the planes). A depthwise conv (one input
    # channel) assigns its first statement instead of zeroing the accumulator first.
    by_phase: dict[int, list[tuple[int, int]]] = {}
    for kh in range(win.kh):
        for kw in range(win.kw):
            by_phase.setdefault(((kh * win.dh) % win.sh) * win.sw + (kw * win.dw) % win.sw, []).append((kh, kw))
    chunk = PLANE_TAPS_PER_STATEMENT
    statements = [ts[i:i + chunk] for ts in by_phase.values() for i in range(0, len(ts), chunk)]
    taps: list[str] = []
    for si, stmt in enumerate(statements):
        terms = []
        for ti, (kh, kw) in enumerate(stmt):
            phase = ((kh * win.dh) % win.sh) * win.sw + (kw * win.dw) % win.sw
            base = ((kh * win.dh) // win.sh) * wg + (kw * win.dw) // win.sw
            taps += [f"                    w{ti} = {aw}[m, c, {kh}, {kw}]",
                     f"                    x{ti} = xp[c * {nph} + {phase}]"]
            terms.append(f"w{ti} * x{ti}[numba.uint64({base} + q)]")
        op = "=" if cg == 1 and si == 0 else "+="
        taps += ["                    for q in range(nq):",
                 f"                        acc_g[numba.uint64(q)] {op} " + " + ".join(terms)]
    # Unsigned indices and trip counts LLVM cannot see, so that the tap loops vectorize (module
    # docstring, "Index arithmetic"): nothing here is ever negative. The loops around the row
    # copies, the tap loops and the epilogue rows count from run-time values (the arrays'
    # shapes, ``opaque``), so LLVM does not unroll them whole: unrolled, ShuffleNet's grouped
    # 1x1 convs (28 channels of 28 rows) took 13 s to compile each, against 2 s, and ran no faster.
    return [
        f"    nq = (ow_n + {rw}) * {win.oh}",
        f"    for t in {prange}({ntask}):",
        f"        xp = np.zeros(({cg * nph}, {size}), dtype=np.{dtype})",
        f"        acc_g = np.empty({win.oh * wg}, dtype=np.{dtype})",
        f"        for v in range(t * {per}, min((t + 1) * {per}, {units})):",
        f"            g = v % {group}",
        f"            n = v // {group}",
        f"            for c in range({aw}.shape[1]):",
        f"                ci = g * {cg} + c",
        f"                for ih in range({ax}.shape[2]):",
        f"                    i = (ih + {win.ph}) // {win.sh}",
        f"                    if i >= {hq}:",
        "                        continue",
        f"                    k = c * {nph} + ((ih + {win.ph}) % {win.sh}) * {win.sw}",
        "                    r = i * " + str(wg),
        *_plane_row_copy(win, wg, ax),
        f"            for j in range(opaque({mg})):",
        f"                m = g * {mg} + j",
        *([] if cg == 1 else ["                acc_g[:] = 0.0"]),
        f"                for c in range(opaque({cg})):",
        *taps,
        f"                for oh in range(opaque({win.oh})):",
        "                    for ow in range(ow_n):",
        f"                        p = {_ix(f'oh * {win.ow} + ow')}",
        f"                        acc = acc_g[oh * {wg} + ow]",
        *_epilogue_lines(body if tail is None else tail.head, "                        "),
        # a unit writes whole planes of its group's channels: a task's units, one run of the output
        *([] if tail is None else _tail_loop(tail, f"t * {per * mg * win.oh * win.ow}",
                                             f"min((t + 1) * {per}, {units}) * {mg * win.oh * win.ow}")),
    ]


PLANE_COPY_UNROLL = 16
"""The plane kernel's row copy loops a literal count below this many column groups, which LLVM
unrolls whole (a run-time count of 7 left a loop with its alias checks: dw5x5 1152 @7 75 -> 128
us), and a count read at run time from there (a constant one is unrolled before it vectorizes)."""


def _plane_row_copy(win: Window, wg: int, ax: str) -> list[str]:
    """The copy of input row ``ih`` of channel ``ci`` into its ``sw`` phase rows ``k .. k + sw - 1``
    of ``xp`` from grid column ``r``: input column ``j * sw + e`` goes to phase ``(e + pw) % sw``
    at grid column ``j + (e + pw) // sw``, one loop over ``j`` storing the row's ``sw``
    interleaved columns (a load group LLVM vectorizes; copied phase by phase, each read the row
    at the stride, one element at a time; :func:`~fusiontune.codegen._window.phase_copy`), its
    trip count as :data:`PLANE_COPY_UNROLL` says; the row's last columns follow one by one. ``xp`` and the input are indexed in full: a view per row costs two
    reference-count updates."""
    cp = phase_copy(win, wg)
    count = str(cp.full) if cp.full < PLANE_COPY_UNROLL else f"{ax}.shape[3] // {win.sw} - {win.w // win.sw - cp.full}"
    lines = [f"                    for j in range({count}):"]
    lines += [f"                        xp[k + {b}, {_ix(f'r + j + {o}')}] = {ax}[n, ci, ih, {_ix(f'j * {win.sw} + {e}')}]"
              for e, b, o in cp.lead]
    lines += [f"                    xp[k + {b}, r + {u}] = {ax}[n, ci, ih, {col}]" for col, b, u in cp.tail]
    return lines


def chan_by_rows(win: Window) -> bool:
    """Whether ``chan`` computes its taps with the row-blocked micro-kernel
    (:func:`~fusiontune.codegen.microkernel.depthwise_rows`): an output row at least one block
    wide. Narrower ones take :func:`~fusiontune.codegen.microkernel.depthwise`, one output
    position's taps at a time."""
    return win.ow >= microkernel.depthwise_row_block()


def pack_depthwise(w: np.ndarray, lanes: int) -> np.ndarray:
    """Depthwise conv weights (C, 1, kernel...) packed for the depthwise micro-kernel: (C in blocks of
    ``lanes`` channels, tap, channel in block); channels past C zero."""
    c = w.shape[0]
    taps = int(np.prod(w.shape[2:]))
    nb = -(-c // lanes)
    wp = np.zeros((nb * lanes, taps), dtype=w.dtype)
    wp[:c] = w.reshape(c, taps)
    return np.ascontiguousarray(wp.reshape(nb, lanes, taps).transpose(0, 2, 1))


def _chan_body(win: Window, group: int, dtype: str, ax: str, aw: str, body: Sequence[str],
               parallel: bool, tail: Tail | None = None, packed: bool = False) -> list[str]:
    """A depthwise conv (one input and one output channel per group) channels-last, in blocks of
    ``VW`` channels (one vector register: 16 float32 lanes with AVX-512), the layout of
    onnxruntime's NCHWc depthwise kernels: one unit per (image, run of blocks). For each block the
    unit copies the channels' input planes into a zero-padded (position, channel) scratch (its
    border, zeroed once per unit, stays zero), then one of codegen/microkernel.py's depthwise
    micro-kernels computes every output position of the block: where an output row holds a block
    of positions (:func:`chan_by_rows`), :func:`~fusiontune.codegen.microkernel.depthwise_rows`
    along the rows, each input vector loaded once per kernel row for every tap that reads it;
    else :func:`~fusiontune.codegen.microkernel.depthwise`,
    :data:`~fusiontune.codegen.microkernel.DEPTHWISE_ROWS` positions at a time, each tap's weight
    vector loaded once for them all. Either stores its result transposed, one contiguous row per
    channel (``tile``), and the epilogue runs over each channel's row and writes its outputs as
    one run, which LLVM vectorizes.

    ``packed``: the weights arrive packed (a build-time :class:`~fusiontune.codegen.common.Derived`
    of :func:`pack_depthwise`); else they are an input, packed on entry.
    """
    vw = microkernel.lanes(dtype)
    rows = microkernel.DEPTHWISE_ROWS
    by_rows = chan_by_rows(win)
    hp, wp = win.hp, win.wp
    taps = win.kh * win.kw
    positions = win.oh * win.ow
    pp = -(-positions // rows) * rows
    nb = -(-group // vw)
    threads = task_threads(parallel)
    nck = max(1, min(nb, -(-2 * threads // win.n)))  # runs of blocks per image
    bpt = -(-nb // nck)
    prange = "numba.prange" if parallel else "range"
    wk = aw
    ldt = max(pp, -(-positions // vw) * vw)  # the rows of ``tile``: the micro-kernels store pp positions
    lines = [
        f"    dst = np.empty({win.h * win.w}, dtype=np.int64)",
        f"    for ih in range({win.h}):",
        f"        for iw in range({win.w}):",
        f"            dst[ih * {win.w} + iw] = ((ih + {win.ph}) * {wp} + {win.pw} + iw) * {vw}",
    ]
    if not by_rows:  # the offsets of every output position's window and of every tap in it
        lines += [
            f"    po = np.zeros({pp}, dtype=np.int64)",
            f"    for oh in range({win.oh}):",
            f"        for ow in range({win.ow}):",
            f"            po[oh * {win.ow} + ow] = (oh * {win.sh * wp} + ow * {win.sw}) * {vw}",
            f"    so = np.empty({taps}, dtype=np.int64)",
            f"    for kh in range({win.kh}):",
            f"        for kw in range({win.kw}):",
            f"            so[kh * {win.kw} + kw] = (kh * {win.dh * wp} + kw * {win.dw}) * {vw}",
        ]
    if not packed:
        wk = "wpk"
        lines += [
            f"    wpk = np.zeros(({nb}, {taps}, {vw}), dtype=np.{dtype})",
            f"    for c in range({group}):",
            f"        for kh in range({win.kh}):",
            f"            for kw in range({win.kw}):",
            f"                wpk[c // {vw}, kh * {win.kw} + kw, c % {vw}] = {aw}[c, 0, kh, kw]",
        ]
    # Trip counts from a run time value (module docstring, "Index arithmetic"): a loop of a small
    # constant count is unrolled before the vectorizer sees it.
    lines += [
        f"    nq = ow_n * {win.oh}",
        f"    for t in {prange}({win.n * nck}):",
        f"        n = t // {nck}",
        f"        b0 = (t % {nck}) * {bpt}",
        f"        b1 = min(b0 + {bpt}, {nb})",
        f"        xt = np.zeros({hp * wp * vw}, dtype=np.{dtype})",
        f"        tile = np.empty(({vw}, {ldt}), dtype=np.{dtype})",
        "        for b in range(b0, b1):",
        f"            c0 = b * {vw}",
        f"            cw = min({vw}, {group} - c0)",
        f"            dw_in({win.h * win.w}, {ax}[n, c0].ctypes.data, {win.h * win.w}, cw, dst.ctypes.data, xt.ctypes.data)",
        *([f"            dwr({win.oh}, {win.ow}, xt.ctypes.data, {win.sh * wp * vw}, {win.dh * wp * vw}, {win.kh}, "
           f"{wk}[b].ctypes.data, tile.ctypes.data, {ldt})"] if by_rows else
          [f"            dwk({pp}, xt.ctypes.data, po.ctypes.data, so.ctypes.data, {taps}, {wk}[b].ctypes.data, "
           f"tile.ctypes.data, {ldt})"]),
        "            for j in range(cw):",
        "                m = c0 + j",
        "                tj = tile[j]",
        "                for q in range(nq):",
        f"                    p = {_ix('q')}",
        "                    acc = tj[p]",
        *_epilogue_lines(body if tail is None else tail.head, "                    "),
        *([] if tail is None else _tail_loop(tail, f"(n * {group} + b0 * {vw}) * {positions}",
                                             f"(n * {group} + min(b1 * {vw}, {group})) * {positions}")),
    ]
    return lines


@dataclass(frozen=True)
class PackedGeometry:
    """Where the packed algorithm's taps read (see :func:`_packed_body`).

    The zero-padded input is split into ``sh x sw`` phase planes (one for a unit-stride conv):
    plane (a, b) holds padded rows ``a + sh * i`` and columns ``b + sw * u``, ``u < wp``. On a
    plane's grid, output position ``oh * wp + ow`` reads, for tap (kh, kw), plane
    ``((kh * dh) % sh, (kw * dw) % sw)`` at grid row ``oh + (kh * dh) // sh`` and column
    ``ow + (kw * dw) // sw``: every tap is one contiguous shifted view, whatever the stride.
    """

    phases: tuple[tuple[int, int], ...]  # the planes the taps read, (a, b)
    wp: int  # grid width
    halo: int  # grid rows a block reads past its own
    slack: int  # elements a block reads past its last grid row


def packed_geometry(win: Window, reach: int) -> PackedGeometry:
    """The phase planes and tap offsets of ``win``; ``reach``: how many grid positions past a
    row's last output one micro-kernel call may read (its block width)."""
    taps = [(kh * win.dh, kw * win.dw) for kh in range(win.kh) for kw in range(win.kw)]
    phases = tuple(sorted({(dy % win.sh, dx % win.sw) for dy, dx in taps}))
    wp = win.ow + max(dx // win.sw for _, dx in taps)
    return PackedGeometry(
        phases,
        wp,
        max(dy // win.sh for dy, _ in taps),
        max(dx // win.sw for _, dx in taps) + reach,
    )


@dataclass(frozen=True)
class PackedPlan:
    """How the packed algorithm lays a conv on the micro-kernel.

    ``orient="lanes"``: vector lanes run over output channels (the weights packed in blocks of
    ``nr`` channels), rows over ``mr`` output positions of one output row, broadcast from the
    input grid; nothing is computed outside the output but the channel padding to ``nr`` and the
    last partial block of a row. ``orient="rows"``: lanes run over grid positions (the input
    grid read as vectors), rows over ``mr`` output channels (broadcast from the packed weights);
    the ``wp - ow`` columns of each grid row are computed and dropped. Depthwise convs (one output
    channel per group) can only take ``rows``.
    """

    orient: str  # "lanes" | "rows"
    uk: microkernel.Shape

    @property
    def block(self) -> int:
        """Output channels per packed weight block."""
        return self.uk.nr if self.orient == "lanes" else self.uk.mr


LANES_COST = 1.12
"""The ``lanes`` layout's extra cost over its padded work: the transposing epilogue and the
broadcasts read down the input grid. Set from benchmarks/bench_conv.py's shapes on one core of an
AVX-512 machine (rows faster by 4-20% on the large-spatial ones, lanes by 5-40% where rows'
padding exceeds about 12%)."""
ROWS_STRIDED_COST = 1.08
"""The ``rows`` layout's extra cost on a strided conv (its reads span several phase planes)."""
LANES_EPILOGUE_16_REGISTERS = 32.0
"""On a CPU of 16 vector registers (AVX2), the ``lanes`` layout costs ``1 + this / max(K,
LANES_EPILOGUE_MIN_K)`` times its padded work (``K``: input channels per group times taps): its
transposing epilogue is paid per output, once per reduction of length ``K``, and weighs most on
the 3-channel stems (K = 147). :data:`ROWS_STRIDED_COST_16_REGISTERS` goes with it. Fitted with
:func:`microkernel.efficiency`'s bound to the times of each block forced in both layouts on 25
dense conv shapes (benchmarks/bench_conv.py's eleven, four weight-heavy ones at 7x7 and 14x14, and
ten of the corpus' ResNet-18, MobileNetV3 and SqueezeNet, down to 1x1 planes; an AMD EPYC (Zen 3)
VM, one thread, 7 interleaved rounds): the rule picks within 0.97 of each shape's best block in
geometric mean, 0.82 at worst (3x3 8->32 @7). A flat lanes cost of 1.04 scored 0.94 (the stems
0.73); ``1 + 32 / K`` unbounded sent the convs of 1x1 to 3x3 planes to ``rows`` (0.48-0.81 of
their best: there ``rows`` computes a whole vector of grid positions for 1 to 9); the AVX-512 rule
(13x1 and 14x1 first) about 0.86 (of the blocks measured for it), 0.37 at worst."""
LANES_EPILOGUE_MIN_K = 160
"""See :data:`LANES_EPILOGUE_16_REGISTERS`: the lanes layout costs at most 1.2 times its work."""
ROWS_STRIDED_COST_16_REGISTERS = 1.08
"""See :data:`LANES_EPILOGUE_16_REGISTERS` and :data:`ROWS_EPILOGUE_16_REGISTERS` (1.16 before
the per-row cost was added; 1.08 fits best with it, as on AVX-512)."""
ROWS_EPILOGUE_16_REGISTERS = 4.0
"""On a CPU of 16 vector registers (AVX2), the ``rows`` layout costs ``1 + this / ow`` times its
padded work: its epilogue copies every output row out of the block, channel by channel, a loop of
``ow`` positions whose scalar tail and setup weigh most on narrow planes (1x1 convs of 3x3 and 4x4
outputs, SqueezeNet's 3x3 convs at 7x7 and 15x15). Refitted with the other AVX2 constants to
``benchmarks/bench_blocks.py``'s times (an AMD EPYC (Zen 3) VM, one thread, 5 interleaved rounds,
2026-12-07): bench_conv.py's ten dense shapes and the 133 distinct dense convs of the 14
TorchScript exports, 12 register blocks (6x2, 5x2, 4x3, 3x3, 3x2, 2x3, 2x4, 4x2, 10x1, 11x1, 12x1,
14x1) in both layouts, and SqueezeNet's 13 again with all 21 blocks. Without it the rule picked
within 0.945 of each shape's best plan in geometric mean (29 of 156 below 0.9, 0.56 at worst: 1x1
24->144 @4, rows 6x2 where lanes 4x3 ran 1.8x faster); with it and strided rows at 1.08, 0.988 (3
below 0.9, 0.71 at worst). It changes 77 of the 143 picks; the 3-channel stems (7x7 s2, 3x3 s2,
4x4 s4) keep theirs, and the 8x8 s8 patch conv moves to its fastest plan measured (lanes 4x3). With
strided rows at 1.16, R = 4 scored 0.983, R = 6 0.979, R = 8 0.968. ``benchmarks/fit_blocks.py``
scores the rule and grids these constants from bench_blocks.py's JSON."""


def plan_packed(win: Window, mg: int, dtype: str, orient: str | None = None, cg: int | None = None,
                block: str | None = None) -> PackedPlan:
    """The orientation (``orient``, or either) and register block with the least predicted time:
    padded work (channels rounded up to the channel block, positions to the position block) over
    the block's measured efficiency (:func:`microkernel.efficiency`), times :data:`LANES_COST` or
    :data:`ROWS_STRIDED_COST` (on AVX2, :data:`LANES_EPILOGUE_16_REGISTERS`,
    :data:`ROWS_STRIDED_COST_16_REGISTERS` and :data:`ROWS_EPILOGUE_16_REGISTERS`). ``cg``: input
    channels per group (default all).
    ``block``: only this register block, ``"<mr>x<nv>"`` (the ``conv_block`` schedule hint that
    benchmarks/bench_blocks.py forces each block with).

    Raises:
        ValueError: ``block`` is not one of :func:`microkernel.blocks` on this CPU.
    """
    allowed = microkernel.blocks()
    if block is not None:
        mr_s, _, nv_s = str(block).partition("x")
        want = (int(mr_s), int(nv_s)) if mr_s.isdigit() and nv_s.isdigit() else None
        if want not in allowed:
            raise ValueError(f"conv_block {block!r}: not a register block of this CPU "
                             f"({', '.join(f'{m}x{v}' for m, v in allowed)})")
        allowed = (want,)
    wp = packed_geometry(win, 0).wp
    strided = (win.sh, win.sw) != (1, 1)
    if microkernel.VECTOR_BITS >= 512:
        lanes_cost = LANES_COST
        rows_cost = ROWS_STRIDED_COST if strided else 1.0
    else:
        k = (win.c if cg is None else cg) * win.kh * win.kw
        lanes_cost = 1.0 + LANES_EPILOGUE_16_REGISTERS / max(k, LANES_EPILOGUE_MIN_K)
        rows_cost = (ROWS_STRIDED_COST_16_REGISTERS if strided else 1.0) * (1.0 + ROWS_EPILOGUE_16_REGISTERS / win.ow)
    best: tuple[float, PackedPlan] | None = None
    for mr, nv in allowed:
        uk = microkernel.Shape(dtype, mr, nv)
        eff = microkernel.efficiency(mr, nv)
        lanes = (-(-mg // uk.nr) * uk.nr / mg) * (-(-win.ow // mr) * mr / win.ow) / eff * lanes_cost
        grid = win.oh * wp
        rows = (-(-mg // mr) * mr / mg) * (-(-grid // uk.nr) * uk.nr / (win.oh * win.ow)) / eff * rows_cost
        for cost, o in ((lanes, "lanes"), (rows, "rows")):
            if orient in (None, o) and (best is None or cost < best[0] - 1e-9):
                best = (cost, PackedPlan(o, uk))
    assert best is not None
    return best[1]


def pack_weights(w: np.ndarray, group: int, block: int) -> np.ndarray:
    """Conv weights (M, C/group, kernel...) packed for the micro-kernel: (group, M/group in blocks
    of ``block`` channels, tap, input channel, channel in block); channels past M/group zero."""
    m, cg = w.shape[:2]
    taps = int(np.prod(w.shape[2:]))
    mg = m // group
    nmb = -(-mg // block)
    wg = np.zeros((group, nmb * block, cg, taps), dtype=w.dtype)
    wg[:, :mg] = w.reshape(group, mg, cg, taps)
    return np.ascontiguousarray(wg.reshape(group, nmb, block, cg, taps).transpose(0, 1, 4, 3, 2))


PACKED_PARAMS = ("n", "h", "w", "oh", "ow", "sh", "sw", "dh", "dw", "kh", "kw", "group", "cg", "mg", "rows",
                 "nblk", "nph", "wp", "halo", "cs", "taps", "nmb", "chunk", "plr", "ldc", "mr", "nr", "blk", "which")
"""The packed kernel's sizes, in the order of its ``params`` array (read into locals ``k_<name>``);
the plane tables follow them: ``pidx`` (sh * sw entries), then ``pl_a``, ``pl_b``, ``pl_u0``,
``pl_u1`` (nph entries each), then the taps' offsets ``sx`` and ``sw`` (taps entries each)."""

PACKED_CONSTANTS = frozenset(("n", "h", "w", "oh", "ow", "sh", "sw", "dh", "dw", "kh", "kw", "rows", "nblk", "nph",
                              "wp", "halo", "taps"))
"""The sizes the packed kernel's source writes as literals: the spatial geometry. The copy and
epilogue loops run over a few output rows of 2 to 56 positions; known to LLVM, they ran the convs
of the small real exports faster (one thread: ResNet-18's dynamo export 0.31-0.33 ms with every
size a runtime parameter, 0.25-0.26 with these literals; SqueezeNet 0.29-0.31 against 0.21-0.22;
MobileNetV3 0.33-0.35 against 0.25-0.26), at 105 compiles for the 846 conv kernels of the 40
real exports instead of 53. Channels, groups, channel blocks, the register block and what
depends on it (the planes' slack ``cs``, the block row ``plr``) stay runtime parameters: the
convs of a network stage share a kernel."""


def _packed_body(win: Window, geo: PackedGeometry, group: int, cg: int, mg: int, rows: int,
                 plan: PackedPlan, fill_with: Fill, aw: str, body: Sequence[str], parallel: bool,
                 prepacked: bool, in_block: bool = False) -> tuple[list[str], tuple[int, ...]]:
    """Any conv as register-blocked micro-kernel calls over shifted views of phase planes.

    A task (image, group, block of output rows) copies its rows of the zero-padded input once
    into phase planes (:class:`PackedGeometry`), ``xp[plane, channel, grid]``. Each micro-kernel
    call then computes one output block with a reduction over every tap and input channel, the
    accumulators in registers throughout: tap ``t`` reads ``xp[plane(t), :, j + row(t) * wp +
    col(t)]`` (channel stride ``cs``) against the packed weights of tap ``t``. The block is
    ``mr`` channels by ``nr`` grid positions (``plan.orient == "rows"``) or ``mr`` positions of
    one output row by ``nr`` channels (``"lanes"``), into a scratch block that the epilogue then
    reads while it is in cache. The weights are packed (:func:`pack_weights`): once at build time
    when they are a constant (``prepacked``), else on entry. ``in_block`` (``lanes`` only): the
    epilogue runs over the block's rows of channels and stores its result back into the block,
    where a fused MaxPool reads it (:func:`_pool_lines`).

    The channel counts, groups, channel blocks and the register block are runtime parameters
    (:data:`PACKED_PARAMS`; the micro-kernel's :func:`~fusiontune.codegen.microkernel.dispatcher`
    takes the block's index), the spatial geometry literals (:data:`PACKED_CONSTANTS`): the source
    depends on the dtype, the geometry, the layout, where the weights come from, whether it runs
    in parallel and the epilogue, so the convs of a network stage share one compile.

    Returns:
        The body's lines, and the parameters.
    """
    uk = plan.uk
    dtype, mr, nr = uk.dtype, uk.mr, uk.nr
    isz = np.dtype(dtype).itemsize
    taps = win.kh * win.kw
    blk_m = plan.block
    nmb = -(-mg // blk_m)
    nblk = -(-win.oh // rows)
    nph = len(geo.phases)
    wp = geo.wp
    cs = (rows + geo.halo) * wp + geo.slack
    wstep = cg * blk_m  # elements of one tap in a packed weight block
    chunk = max(1, (256 * 1024) // (taps * wstep * isz))  # weight blocks that stay in half of L2
    plr = -(-(rows * wp) // nr) * nr
    ldc = nmb * nr
    planes = []
    for a, b in geo.phases:
        u0 = min(wp, -(-(win.pw - b) // win.sw)) if win.pw > b else 0  # first grid column inside the input
        u1 = min(wp, (win.w - 1 + win.pw - b) // win.sw + 1) if win.w - 1 + win.pw - b >= 0 else 0
        planes.append((a - win.ph, b - win.pw, u0, max(u0, u1)))
    pidx = [0] * (win.sh * win.sw)
    for i, (a, b) in enumerate(geo.phases):
        pidx[a * win.sw + b] = i
    sizes = dict(n=win.n, h=win.h, w=win.w, oh=win.oh, ow=win.ow, sh=win.sh, sw=win.sw, dh=win.dh, dw=win.dw,
                 kh=win.kh, kw=win.kw, group=group, cg=cg, mg=mg, rows=rows, nblk=nblk, nph=nph, wp=wp,
                 halo=geo.halo, cs=cs, taps=taps, nmb=nmb, chunk=chunk, plr=plr, ldc=ldc, mr=mr, nr=nr, blk=blk_m,
                 which=microkernel.block_index(uk))
    # The taps' offsets into the planes and the packed weights, computed here and passed with the
    # sizes: the kernel took two allocations and a loop per call to compute them.
    taps_at = [(i * win.dh, j * win.dw) for i in range(win.kh) for j in range(win.kw)]
    sx = [pidx[(dy % win.sh) * win.sw + dx % win.sw] * cg * cs + (dy // win.sh) * wp + dx // win.sw
          for dy, dx in taps_at]
    sw = [tp * cg * blk_m for tp in range(taps)]
    params = tuple(sizes[k] for k in PACKED_PARAMS) + tuple(pidx) + tuple(
        p[i] for i in range(4) for p in planes) + tuple(sx) + tuple(sw)
    base = len(PACKED_PARAMS)
    at_sx = base + win.sh * win.sw + 4 * nph
    prange = "numba.prange" if parallel else "range"
    out = [f"    k_{k} = {sizes[k]}" if k in PACKED_CONSTANTS else f"    k_{k} = prm[{i}]"
           for i, k in enumerate(PACKED_PARAMS)]
    out += [
        f"    ow_n = prm[{PACKED_PARAMS.index('ow')}]",  # a row's width LLVM cannot see (module docstring)
        f"    pidx = prm[{base}:{base} + k_sh * k_sw]",
        f"    pl_a = prm[{base} + k_sh * k_sw:]",
        "    pl_b = pl_a[k_nph:]",
        "    pl_u0 = pl_b[k_nph:]",
        "    pl_u1 = pl_u0[k_nph:]",
    ]
    out += [f"    wpk = {aw}"] if prepacked else [
        f"    wpk = np.zeros((k_group, k_nmb, k_taps, k_cg, k_blk), dtype=np.{dtype})",
        f"    for gm in {prange}(k_group * k_mg):",
        "        g = gm // k_mg",
        "        mm = gm % k_mg",
        "        for c in range(k_cg):",
        "            for i in range(k_kh):",
        "                for j in range(k_kw):",
        f"                    wpk[g, mm // k_blk, i * k_kw + j, c, mm % k_blk] = {aw}[gm, c, i, j]",
    ]
    # The taps' offsets (a slice of the parameters, however many taps: a weight-gradient conv has a
    # kernel as large as an activation)
    out += [
        f"    sx = prm[{at_sx}:{at_sx} + k_taps]",
        f"    sw = prm[{at_sx} + k_taps:{at_sx} + 2 * k_taps]",
        "    grid_end = (k_rows + k_halo) * k_wp",
    ]
    out += [
        f"    for t in {prange}(k_n * k_group * k_nblk):",
        "        n = t // (k_group * k_nblk)",
        "        g = (t // k_nblk) % k_group",
        "        r0 = (t % k_nblk) * k_rows",
        "        r1 = min(r0 + k_rows, k_oh)",
        "        nrow = r1 - r0 + k_halo",
    ]
    # Every element of xp is written once: the input where the grid is inside it, zero elsewhere
    # (padding, rows past the block, and the slack the last calls read past the grid). A unit
    # stride is written as such, so that the copy of a row is a contiguous one.
    # A prologue (:class:`Fill`) is applied here, to each element as it is copied: the padding
    # stays zero, as the Conv pads the prologue's result.
    col = _ix("u + pb" if win.sw == 1 else f"u * {win.sw} + pb")
    # One plane (unit stride and dilation, most convs): its bounds as literals, which LLVM folds
    # into the copy loops (ResNet-18's export ran 0.26 ms with them read from the plane tables,
    # 0.19 with literals). Several planes loop over the tables: written out once per plane, the
    # copy made a 224x224 stride-2 stem take 10 s to compile.
    plane = ("pl_a[pi]", "pl_b[pi]", "pl_u0[pi]", "pl_u1[pi]") if nph > 1 else tuple(str(v) for v in planes[0])
    rows_phases = sorted({a for a, _ in geo.phases})
    if (win.sw > 1 and not fill_with.elem and fill_with.value == "xi0[COL]"
            and len(geo.phases) == len(rows_phases) * win.sw):
        fill = _phase_rows_fill(win, geo, planes, rows_phases, fill_with, dtype)
    else:
        fill = _planes_fill(win, col, plane, fill_with, dtype, out)
    fill += ["src = xp.ctypes.data", "ld = k_cs"]
    # A 1x1 conv copies its block too: read in place (channel stride H*W, 12.5 KB at 56x56) it ran
    # 1x1 64->256 @56 in 0.98 ms against 0.86 copied, the copy's short stride keeping the
    # reduction's rows apart in L1.
    out += ["        " + f for f in fill]
    if plan.orient == "rows":
        out += [
            "        pl = (r1 - r0) * k_wp",
            f"        blk = np.empty((k_nmb * k_mr, k_plr), dtype=np.{dtype})",
            "        for mc in range(0, k_nmb, k_chunk):",
            "            for j0 in range(0, pl, k_nr):",
            "                for mb in range(mc, min(mc + k_chunk, k_nmb)):",
            f"                    uk(k_which, k_cg, wpk[g, mb].ctypes.data, k_mr, sw.ctypes.data, src + j0 * {isz}, ld,"
            f" sx.ctypes.data, blk.ctypes.data + (mb * k_mr * k_plr + j0) * {isz}, k_plr, k_taps, 0)",
        ]
        out += _packed_rows_epilogue(win, body, dtype)
    else:
        out += [
            # positions (row-major over the block's output rows, width ow) by channels; the last
            # call of a row may spill up to mr - 1 positions into the next row, rewritten after.
            # Weight block outer: each is read from memory once per task and reused from L2 for
            # every position of the block.
            f"        blk = np.empty((k_rows * k_ow + k_mr, k_ldc), dtype=np.{dtype})",
            "        for mb in range(k_nmb):",
            "            for oh in range(r0, r1):",
            "                for c0 in range(0, k_ow, k_mr):",
            "                    q = (oh - r0) * k_ow + c0",
            f"                    uk(k_which, k_cg, src + ((oh - r0) * k_wp + c0) * {isz}, ld, sx.ctypes.data,"
            f" wpk[g, mb].ctypes.data, k_nr, sw.ctypes.data, blk.ctypes.data + (q * k_ldc + mb * k_nr) * {isz},"
            " k_ldc, k_taps, 0)",
        ]
    if plan.orient != "rows" and in_block:
        out += [
            # over each position's row of channels, in place (contiguous, so it vectorizes)
            "        for q in range((r1 - r0) * k_ow):",
            f"            p = {_ix('r0 * k_ow + q')}",
            "            for mm in range(k_mg):",
            "                m = g * k_mg + mm",
            f"                acc = blk[{_ix('q')}, mm]",
            *_epilogue_lines(body, "                "),
        ]
    elif plan.orient != "rows":
        out += [
            # the epilogue transposes in tiles of 64 positions: a channel's column of the tile is
            # gathered into a contiguous row (64 rows of blk stay in L1), and the epilogue runs
            # over that row and writes the channel's 64 outputs as one run, so LLVM vectorizes it
            # (run down blk's column directly, a GELU epilogue took 28 ns per element)
            "        p0 = r0 * k_ow",
            "        nq = (r1 - r0) * k_ow",
            f"        tile = np.empty(64, dtype=np.{dtype})",
            "        for q0 in range(0, nq, 64):",
            "            q1 = min(q0 + 64, nq)",
            "            for mm in range(k_mg):",
            "                m = g * k_mg + mm",
            "                for q in range(q0, q1):",
            "                    tile[q - q0] = blk[q, mm]",
            "                for u in range(q1 - q0):",
            f"                    p = {_ix('p0 + q0 + u')}",
            "                    acc = tile[u]",
            *_epilogue_lines(body, "                    "),
        ]
    if not parallel:
        out = _hoist_scratch(out)
    return out, params


_SCRATCH = re.compile(r"^ {8}(xp|blk|cb|tile|de) = np\.empty\(")


def _hoist_scratch(lines: list[str]) -> list[str]:
    """A serial packed kernel's task loop with its scratch arrays (``xp``, ``blk``, ``cb``,
    ``tile``, ``de``: every element a task reads it has written first) allocated once before the
    loop instead of once per task; a parallel kernel keeps one per task. An allocation and its
    release cost 30-80 ns, five of them per task."""
    loop = next(i for i, line in enumerate(lines) if line.startswith("    for t in range("))
    scratch = [line for line in lines[loop:] if _SCRATCH.match(line)]
    rest = [line for line in lines[loop:] if not _SCRATCH.match(line)]
    return lines[:loop] + [line[4:] for line in scratch] + rest


def _planes_fill(win: Window, col: str, plane: tuple[str, ...], fill_with: Fill, dtype: str,
                 out: list[str]) -> list[str]:
    """The packed kernel's input copy plane by plane (``xp`` allocated, not cleared): each phase
    plane's rows from the input's rows of its row phase, its pad columns, the rows outside the
    input and the slack zeroed as it goes. A prologue runs here.

    At column stride 2 without a prologue (a strided conv whose taps do not read every column
    phase, such as a 1x1 at stride 2: else :func:`_phase_rows_fill`), each input row is first
    split into its even and odd columns (``de``, its allocation added to ``out``), one loop that
    reads the row at unit stride and that LLVM vectorizes as an interleaved pair; the phase plane
    then copies a contiguous run of one half. Read at stride 2 in the plane's own loop, the copy
    ran scalar: SqueezeNet's stem (3x3 s2 3->16 @64, batch 2) took 28 us against 14.5 for the
    same conv at stride 1 on a 33x33 input."""
    split = win.sw == 2 and not fill_with.elem and fill_with.value == "xi0[COL]"
    if split:
        half = [
            "for j in range(xi0.shape[0] // 2):",  # a bound LLVM cannot see: a constant one unrolled it
            f"    de[0, {_ix('j')}] = xi0[{_ix('2 * j')}]",
            f"    de[1, {_ix('j')}] = xi0[{_ix('2 * j + 1')}]",
            *([f"de[0, {win.w // 2}] = xi0[{win.w - 1}]"] if win.w % 2 else []),
            "dp = de[pb % 2]",
            "dq = pb // 2",
        ]
        value = f"dp[{_ix('u + dq')}]"
        out.append(f"        de = np.empty((2, {(win.w + 1) // 2}), dtype=np.{dtype})")
    else:
        half, value = [], fill_with.value.replace("COL", col)
    fill: list[str] = [
        f"xp = np.empty((k_nph, k_cg, k_cs), dtype=np.{dtype})",
        "for pi in range(k_nph):",
        f"    pa = {plane[0]}",
        f"    pb = {plane[1]}",
        f"    u0 = {plane[2]}",
        f"    u1 = {plane[3]}",
        "    for c in range(k_cg):",
        "        ci = g * k_cg + c",
        *("        " + s for s in fill_with.chan),
        "        xr = xp[pi, c]",
        "        for i in range(k_rows + k_halo):",
        "            ih = (r0 + i) * k_sh + pa",
        "            q = i * k_wp",
        "            if i < nrow and ih >= 0 and ih < k_h:",
        *("                " + s for s in fill_with.rows),
        *("                " + s for s in half),
        "                for u in range(u0):",
        f"                    xr[{_ix('q + u')}] = 0.0",
        "                for u in range(u0, u1):",
        *("                    " + s.replace("COL", col) for s in fill_with.elem),
        f"                    xr[{_ix('q + u')}] = {value}",
        "                for u in range(u1, k_wp):",
        f"                    xr[{_ix('q + u')}] = 0.0",
        "            else:",
        "                for u in range(k_wp):",
        f"                    xr[{_ix('q + u')}] = 0.0",
        "        for u in range(grid_end, k_cs):",
        "            xr[u] = 0.0",
    ]
    return fill


def _zero(target: str, lo: int, hi: int, indent: str) -> list[str]:
    """Statements zeroing ``target[lo:hi]`` of an xp row (``target`` ends in the row's base
    index): a literal store each up to 4 elements, a loop beyond."""
    if hi - lo <= 4:
        return [f"{indent}xp[{target} + {u}] = 0.0" for u in range(lo, hi)]
    return [f"{indent}for u in range({lo}, {hi}):", f"{indent}    xp[{target} + u] = 0.0"]


def _phase_rows_fill(win: Window, geo: PackedGeometry, planes: Sequence[tuple[int, int, int, int]],
                     rows_phases: Sequence[int], fill_with: Fill, dtype: str) -> list[str]:
    """The packed kernel's input copy of a strided conv whose taps read every column phase of
    the row phases they read (a 3x3, 7x7 or 4x4 window at stride 2 or 4, not a 1x1): each input
    row is read once, at unit stride, its ``sw`` interleaved columns stored into their phase
    planes in one loop (a load group LLVM vectorizes, as the plane kernel's
    :func:`_plane_row_copy`); the planes' pad columns are literal stores, rows outside the input
    and the rows and slack past the block zeroed as runs. ``planes``: per phase of ``geo``,
    (row offset, column offset, first and end grid column inside the input), as
    :func:`_packed_body` computes them. Plane by plane, each row was split once per plane and
    copied in three short loops; against that, the conv alone (one thread, batch 2, the two
    kernels interleaved in one process, median of 15 rounds): SqueezeNet's stem 3x3 s2 3->16
    @64 1.20x faster, MobileNetV3's 3x3 s2 p1 3->8 @64 1.26x, ResNet-18's 7x7 s2 3->8 @64 1.10x,
    ConvNeXt's 4x4 s4 patchify 3->8 @64 1.39x, ViT's 8x8 s8 3->64 @32 1.55x, 3x3 s2 16->32 @32
    1.22x, 3x3 s2 64->64 @56 1.12x. Cleared whole first instead (``np.zeros``), the last but one was
    0.84x: its 77 KB of planes took 2-5 us to clear, more than the copy."""
    cp = phase_copy(win, geo.wp)
    wp = geo.wp
    pidx = {ab: i for i, ab in enumerate(geo.phases)}
    count = str(cp.full) if cp.full < PLANE_COPY_UNROLL else f"xi0.shape[0] // {win.sw} - {win.w // win.sw - cp.full}"
    fill = [f"xp = np.empty((k_nph, k_cg, k_cs), dtype=np.{dtype})",
            "for c in range(k_cg):",
            "    ci = g * k_cg + c",
            "    for i in range(nrow):",
            "        q = i * k_wp"]
    for a in rows_phases:
        d = a - win.ph
        fill += [f"        ih = (r0 + i) * k_sh {'-' if d < 0 else '+'} {abs(d)}",
                 "        if ih >= 0 and ih < k_h:",
                 *("            " + s for s in fill_with.rows),
                 f"            for j in range({count}):"]
        fill += [f"                xp[{pidx[a, b]}, c, {_ix(f'q + j + {o}')}] = xi0[{_ix(f'j * {win.sw} + {e}')}]"
                 for e, b, o in cp.lead]
        fill += [f"            xp[{pidx[a, b]}, c, q + {u}] = xi0[{cl}]" for cl, b, u in cp.tail]
        for b in range(win.sw):
            _, _, u0, u1 = planes[pidx[a, b]]
            fill += _zero(f"{pidx[a, b]}, c, q", 0, u0, "            ")
            fill += _zero(f"{pidx[a, b]}, c, q", u1, wp, "            ")
        fill += ["        else:"]
        fill += [s for b in range(win.sw) for s in _zero(f"{pidx[a, b]}, c, q", 0, wp, "            ")]
    fill += ["    for pi in range(k_nph):",
             "        for u in range(nrow * k_wp, k_cs):",
             "            xp[pi, c, u] = 0.0"]
    return fill


def _packed_rows_epilogue(win: Window, body: Sequence[str], dtype: str) -> list[str]:
    """The epilogue of a packed task in the ``rows`` layout (``blk``: a row of grid positions per
    channel). An output row of a whole number of vectors runs over each grid row in place
    (:func:`_grid_epilogue`). Any other width: each channel's output rows are first gathered
    out of the grid, its pad columns dropped, into one contiguous run in masked vectors
    (``rcp``: microkernel.rows_copy), and the epilogue runs over that run as one flat loop; over
    each grid row, the loop of 7 to 31 outputs ran mostly as its scalar remainder. One thread,
    the conv alone, interleaved with the per-row epilogue: 3x3 8->16 (batch 2, the ``rows``
    layout) at output widths 7, 15, 31 and 48 1.23x, 1.16x, 1.06x and 1.03x faster; at 16, 32
    and 64, 0.99x, 0.95x and 0.93x, hence the rule. SqueezeNet's stem (3x3 s2 3->16, 31x31
    outputs): the epilogue 6.8 -> 4.3 us, the gather 2.5 of them."""
    if win.ow % microkernel.lanes(dtype) == 0:
        return _grid_epilogue("k_mg", "k_wp", "k_ow", body)
    isz = np.dtype(dtype).itemsize
    return [
        f"        cb = np.empty(k_rows * k_ow, dtype=np.{dtype})",
        "        nq = (r1 - r0) * ow_n",
        "        p0 = r0 * k_ow",
        "        for mm in range(k_mg):",
        "            m = g * k_mg + mm",
        f"            rcp(r1 - r0, ow_n, blk.ctypes.data + mm * k_plr * {isz}, k_wp, cb.ctypes.data, ow_n)",
        "            for u in range(nq):",
        f"                p = {_ix('p0 + u')}",
        f"                acc = cb[{_ix('u')}]",
        *_epilogue_lines(body, "                "),
    ]
