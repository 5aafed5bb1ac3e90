"""Export small random-initialized transformers and torchvision models with torch.onnx.export.

Where ``export_models.py`` writes graphs by hand the way an exporter would, this script runs the
exporters themselves, so the corpus under ``real/`` holds what users actually feed fusiontune:
every op sequence, shape subgraph, mask construction and naming convention of torch 2.13's two
ONNX exporters on the model code of transformers and torchvision.

Each model is exported three ways:

* ``<name>.dynamo.onnx``: ``torch.onnx.export(..., dynamo=True)``, torch's default, with its
  ONNX optimizer (constant folding, dead code elimination, function inlining) as by default;
* ``<name>.dynamo_noopt.onnx``: the same with ``optimize=False``;
* ``<name>.torchscript.onnx``: the TorchScript exporter, ``dynamo=False, opset_version=17``.

Beside each file: ``<file stem>.inputs.npz`` (the example inputs, keyed by the ONNX input names)
and ``<file stem>.torch.npz`` (the eager PyTorch outputs, keyed by the ONNX output names). An
export that fails is printed and listed in ``real/MANIFEST.json`` with its one-line reason.

Models (random weights from a fixed seed; transformers models use their default attention, which
in transformers 5 is ``sdpa``; all in eval mode):

* transformers, hidden 64, 2 layers, 4 heads, vocab 128, inputs ``input_ids`` and
  ``attention_mask`` (int64, batch 2, seq 12; the second row ends in 3 padding zeros), dynamic
  ``batch`` and ``seq``, output ``last_hidden_state``: ``bert`` (BertModel, no pooler), ``gpt2``
  (GPT2Model, ``gelu_new``), ``llama`` (LlamaModel, 4 query / 2 key-value heads), ``qwen2``
  (Qwen2Model, 4 / 2 heads), ``t5_encoder`` (T5EncoderModel, ``gated-gelu``, 8 relative position
  buckets) and ``t5_encoder_eager`` (the same with ``attn_implementation="eager"``: the dynamo
  exporter fails on T5's sdpa path, so this is the only dynamo export of T5);
* ``vit`` (ViTModel, 32x32 image, 8x8 patches, no pooler, output ``last_hidden_state``) and
  ``whisper_encoder`` (WhisperEncoder, 16 mel bins, 32 frames, output ``last_hidden_state``),
  dynamic ``batch``;
* torchvision classifiers, 10 classes, input ``pixel_values`` (batch, 3, 64, 64), dynamic
  ``batch``, output ``logits``: ``resnet18`` (torchvision's ResNet and BasicBlock, layers
  [2, 2, 2, 2], stem and stage widths 8/16/32/64 instead of 64/128/256/512), ``mobilenet_v3_small``
  (``width_mult=0.25``), ``efficientnet_b0`` (``width_mult=0.25, depth_mult=0.5``),
  ``squeezenet1_1`` (SqueezeNet 1.1's layer sequence with every channel count divided by 4, the
  final conv kaiming-initialized like the others instead of N(0, 0.01), biases 0.01),
  ``convnext_tiny`` (ConvNeXt, stage widths 8/16/32/64 instead of 96/192/384/768, depths
  (1, 1, 3, 1) instead of (3, 3, 9, 3), ``layer_scale=0.5`` instead of 1e-6 so the random blocks
  are not no-ops), ``densenet121`` (DenseNet, block_config (6, 12, 24, 16) as 121, growth rate 6,
  12 initial features, bn_size 2 instead of 32, 64, 4). BatchNorm running statistics are set to
  the mean and variance over 4 random batches of 8 (train mode, then eval).

Every parameter that its initializer sets to one value (LayerNorm / RMSNorm / BatchNorm scales of
1, zero biases, ConvNeXt's layer scale) gets N(0, 0.1) noise, as trained weights would: a fusion
that drops a scale or a bias then shows in the error, and the dynamo optimizer does not merge the
identical initializers into one shared tensor.

The dynamo exporter records stack traces (with local paths) in node metadata: every node's
``metadata_props`` and ``doc_string`` are cleared, and model / graph metadata that names a path is
dropped, before saving. The script checks that no file contains ``/work/`` or ``/root/``.

torchvision is installed with ``pip install --no-deps torchvision``; its native library may not load
beside a CPU torch, so the two ops its import registers are defined first (the model constructors
need no native code). transformers imports torchvision itself when it is installed, so this runs
before any transformers import.

    .venv/bin/python search_spaces/models/export_real.py               # rewrite everything in real/
    .venv/bin/python search_spaces/models/export_real.py --only llama  # one model (its 3 files)
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
OUT = HERE / "real"
EXPORTERS = ("dynamo", "dynamo_noopt", "torchscript")
TORCHSCRIPT_OPSET = 17
FORBIDDEN = (b"/work/", b"/root/")

BATCH, SEQ, MAX_POS = 2, 12, 64
VOCAB, HIDDEN, LAYERS, HEADS, FFN = 128, 64, 2, 4, 128
CLASSES, IMAGE = 10, 64


# ---- torchvision import ----------------------------------------------------------------------
def _torchvision() -> Any:
    """Import torchvision, defining first the two ops its import registers.

    The torchvision wheel is a CUDA build whose native library fails to load beside the CPU torch;
    its import then registers fake kernels for ``torchvision::nms`` / ``qnms``, which needs the
    schemas. The model constructors themselves use no native code.
    """
    try:
        torch.ops.torchvision.nms  # noqa: B018 - raises when the schema is missing
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _torchvision.lib = lib  # type: ignore[attr-defined]  # keep the library alive
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchvision

    return torchvision


# ---- the models ------------------------------------------------------------------------------
class Wrapper(nn.Module):
    """A model behind a forward with named tensor arguments and one tensor output.

    The argument names become the ONNX input names; transformers models return their
    ``last_hidden_state`` (``return_dict=True``), torchvision classifiers their logits.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class TextModel(Wrapper):
    """``(input_ids, attention_mask) -> last_hidden_state``."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, return_dict=True
        ).last_hidden_state


class PixelModel(Wrapper):
    """``pixel_values -> last_hidden_state`` (ViT)."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).last_hidden_state


class Classifier(Wrapper):
    """``pixel_values -> logits`` (torchvision classifiers)."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)


class AudioModel(Wrapper):
    """``input_features -> last_hidden_state`` (Whisper encoder)."""

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.model(input_features=input_features, return_dict=True).last_hidden_state


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=MAX_POS,
        type_vocab_size=2,
    )
    return TextModel(BertModel(cfg, add_pooling_layer=False))


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=FFN,
        n_positions=MAX_POS,
        activation_function="gelu_new",
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return TextModel(GPT2Model(cfg))


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        max_position_embeddings=MAX_POS,
        use_cache=False,
    )
    return TextModel(LlamaModel(cfg))


def _qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2Model

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,
        max_position_embeddings=MAX_POS,
        use_cache=False,
    )
    return TextModel(Qwen2Model(cfg))


def _t5_encoder(attn: str | None = None) -> nn.Module:
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        use_cache=False,
        attn_implementation=attn,
    )
    return TextModel(T5EncoderModel(cfg))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
    )
    return PixelModel(ViTModel(cfg, add_pooling_layer=False))


def _whisper_encoder() -> nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_layers=LAYERS,
        decoder_attention_heads=HEADS,
        decoder_ffn_dim=FFN,
        max_source_positions=16,
        max_target_positions=MAX_POS,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=3,
    )
    return AudioModel(WhisperEncoder(cfg))


def _resnet18() -> nn.Module:
    """torchvision's ResNet (BasicBlock, layers [2, 2, 2, 2]) with stage widths 8/16/32/64."""
    tv = _torchvision()
    from torchvision.models.resnet import BasicBlock, ResNet

    class NarrowResNet(ResNet):
        """ResNet.__init__ with the widths as a parameter; _make_layer, forward: torchvision's."""

        def __init__(self, widths: Sequence[int], layers: Sequence[int], num_classes: int) -> None:
            nn.Module.__init__(self)
            self._norm_layer = nn.BatchNorm2d
            self.inplanes, self.dilation, self.groups, self.base_width = widths[0], 1, 1, 64
            self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(BasicBlock, widths[0], layers[0])
            self.layer2 = self._make_layer(BasicBlock, widths[1], layers[1], stride=2)
            self.layer3 = self._make_layer(BasicBlock, widths[2], layers[2], stride=2)
            self.layer4 = self._make_layer(BasicBlock, widths[3], layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[3] * BasicBlock.expansion, num_classes)
            for m in self.modules():  # torchvision's initialization
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

    del tv
    return Classifier(NarrowResNet((8, 16, 32, 64), (2, 2, 2, 2), CLASSES))


def _mobilenet_v3_small() -> nn.Module:
    _torchvision()
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    setting, last_channel = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25)
    return Classifier(MobileNetV3(setting, last_channel, num_classes=CLASSES))


def _efficientnet_b0() -> nn.Module:
    _torchvision()
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.5)
    return Classifier(
        EfficientNet(setting, dropout=0.2, num_classes=CLASSES, last_channel=last_channel)
    )


def _squeezenet1_1() -> nn.Module:
    """SqueezeNet 1.1's layers (torchvision's Fire and forward) with every channel count / 4."""
    _torchvision()
    from torch.nn import init
    from torchvision.models.squeezenet import Fire, SqueezeNet

    class NarrowSqueezeNet(SqueezeNet):
        def __init__(self, num_classes: int, div: int = 4) -> None:
            nn.Module.__init__(self)
            self.num_classes = num_classes

            def fire(cin: int, squeeze: int, e1: int, e3: int) -> Fire:
                return Fire(cin // div, squeeze // div, e1 // div, e3 // div)

            self.features = nn.Sequential(
                nn.Conv2d(3, 64 // div, kernel_size=3, stride=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                fire(64, 16, 64, 64),
                fire(128, 16, 64, 64),
                nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                fire(128, 32, 128, 128),
                fire(256, 32, 128, 128),
                nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                fire(256, 48, 192, 192),
                fire(384, 48, 192, 192),
                fire(384, 64, 256, 256),
                fire(512, 64, 256, 256),
            )
            final_conv = nn.Conv2d(512 // div, num_classes, kernel_size=1)
            self.classifier = nn.Sequential(
                nn.Dropout(p=0.5), final_conv, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1))
            )
            for m in self.modules():  # torchvision's initialization, but a kaiming final conv
                if isinstance(m, nn.Conv2d):
                    init.kaiming_uniform_(m.weight)
                    if m.bias is not None:
                        init.constant_(m.bias, 0.01)

    return Classifier(NarrowSqueezeNet(CLASSES))


def _convnext_tiny() -> nn.Module:
    _torchvision()
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    setting = [
        CNBlockConfig(8, 16, 1),
        CNBlockConfig(16, 32, 1),
        CNBlockConfig(32, 64, 3),
        CNBlockConfig(64, None, 1),
    ]
    return Classifier(
        ConvNeXt(setting, stochastic_depth_prob=0.0, layer_scale=0.5, num_classes=CLASSES)
    )


def _densenet121() -> nn.Module:
    _torchvision()
    from torchvision.models.densenet import DenseNet

    return Classifier(
        DenseNet(
            growth_rate=6,
            block_config=(6, 12, 24, 16),
            num_init_features=12,
            bn_size=2,
            num_classes=CLASSES,
        )
    )


# ---- example inputs --------------------------------------------------------------------------
def _text_inputs(gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    mask[1, -3:] = 0  # right padding in the second row
    return {"input_ids": ids, "attention_mask": mask}


def _image_inputs(size: int) -> Callable[[torch.Generator], dict[str, torch.Tensor]]:
    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=gen)}

    return make


def _audio_inputs(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(BATCH, 16, 32, generator=gen)}


TEXT_AXES = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
TEXT_OUT = {0: "batch", 1: "seq"}


@dataclass(frozen=True)
class Spec:
    """One model of the corpus.

    Attributes:
        name: file stem.
        family: what it is (``bert``, ``llama``, ``resnet``...).
        source: ``transformers`` or ``torchvision``.
        build: returns the module (random weights from the current torch seed).
        inputs: example inputs from a seeded generator, in the forward's argument order.
        axes: the dynamic axes per input (index -> name).
        output: the ONNX output name.
        bn_calibrate: run random batches in train mode to set BatchNorm running statistics.
        description: one line for the manifest.
        max_dims: upper bounds of dynamic dimensions (torch.export checks them).
        output_axes: the output's dynamic axes (TorchScript exporter).
    """

    name: str
    family: str
    source: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    axes: dict[str, dict[int, str]]
    output: str
    bn_calibrate: bool = False
    description: str = ""
    max_dims: dict[str, int] = field(default_factory=dict)
    output_axes: dict[int, str] = field(default_factory=lambda: {0: "batch"})


def _vision(name: str, family: str, build: Callable[[], nn.Module], description: str) -> Spec:
    return Spec(
        name,
        family,
        "torchvision",
        build,
        _image_inputs(IMAGE),
        {"pixel_values": {0: "batch"}},
        "logits",
        bn_calibrate=True,
        description=description,
    )


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec(
            "bert",
            "bert",
            "transformers",
            _bert,
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="BertModel (no pooler), hidden 64, 2 layers, 4 heads, FFN 128, erf GELU",
            max_dims={"seq": MAX_POS},
            output_axes=TEXT_OUT,
        ),
        Spec(
            "gpt2",
            "gpt2",
            "transformers",
            _gpt2,
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="GPT2Model, hidden 64, 2 layers, 4 heads, FFN 128, gelu_new (tanh)",
            max_dims={"seq": MAX_POS},
            output_axes=TEXT_OUT,
        ),
        Spec(
            "llama",
            "llama",
            "transformers",
            _llama,
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="LlamaModel, hidden 64, 2 layers, 4 query / 2 kv heads, SwiGLU 128, "
            "RMSNorm, rotary",
            max_dims={"seq": MAX_POS},
            output_axes=TEXT_OUT,
        ),
        Spec(
            "qwen2",
            "qwen2",
            "transformers",
            _qwen2,
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="Qwen2Model, hidden 64, 2 layers, 4 query / 2 kv heads, qkv bias, "
            "SwiGLU 128",
            max_dims={"seq": MAX_POS},
            output_axes=TEXT_OUT,
        ),
        Spec(
            "t5_encoder",
            "t5",
            "transformers",
            _t5_encoder,
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="T5EncoderModel, d_model 64, 2 layers, 4 heads, gated-gelu (tanh GeGLU), "
            "relative position bias",
            output_axes=TEXT_OUT,
        ),
        Spec(
            "t5_encoder_eager",
            "t5",
            "transformers",
            lambda: _t5_encoder("eager"),
            _text_inputs,
            TEXT_AXES,
            "last_hidden_state",
            description="t5_encoder with attn_implementation='eager' (the dynamo "
            "exporter fails on T5's sdpa path)",
            output_axes=TEXT_OUT,
        ),
        Spec(
            "vit",
            "vit",
            "transformers",
            _vit,
            _image_inputs(32),
            {"pixel_values": {0: "batch"}},
            "last_hidden_state",
            description="ViTModel (no pooler), 3x32x32 image, 8x8 patches, hidden 64, 2 layers, "
            "4 heads",
        ),
        Spec(
            "whisper_encoder",
            "whisper",
            "transformers",
            _whisper_encoder,
            _audio_inputs,
            {"input_features": {0: "batch"}},
            "last_hidden_state",
            description="WhisperEncoder, 16 mel bins x 32 frames, d_model 64, 2 layers, 4 heads",
        ),
        _vision(
            "resnet18",
            "resnet",
            _resnet18,
            "ResNet-18 structure, widths 8/16/32/64, 3x64x64, 10 classes",
        ),
        _vision(
            "mobilenet_v3_small",
            "mobilenet",
            _mobilenet_v3_small,
            "MobileNetV3-Small, width_mult 0.25, 3x64x64, 10 classes",
        ),
        _vision(
            "efficientnet_b0",
            "efficientnet",
            _efficientnet_b0,
            "EfficientNet-B0, width_mult 0.25, depth_mult 0.5, 3x64x64, 10 classes",
        ),
        _vision(
            "squeezenet1_1",
            "squeezenet",
            _squeezenet1_1,
            "SqueezeNet 1.1, channels / 4, 3x64x64, 10 classes",
        ),
        _vision(
            "convnext_tiny",
            "convnext",
            _convnext_tiny,
            "ConvNeXt, widths 8/16/32/64, depths 1/1/3/1, layer_scale 0.5, 3x64x64, 10 classes",
        ),
        _vision(
            "densenet121",
            "densenet",
            _densenet121,
            "DenseNet-121 blocks (6, 12, 24, 16), growth 6, 12 init features, bn_size 2, 3x64x64",
        ),
    )
}


# ---- building and exporting ------------------------------------------------------------------
def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@torch.no_grad()
def _calibrate_batchnorm(
    model: nn.Module, spec: Spec, gen: torch.Generator, batches: int = 4
) -> None:
    """Set BatchNorm running statistics to the cumulative mean / variance over random batches."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average
    model.train()
    for _ in range(batches):
        x = spec.inputs(gen)
        model(**{k: torch.cat([v] * 4) for k, v in x.items()})
    for bn in bns:
        bn.momentum = 0.1
    model.eval()


@torch.no_grad()
def _perturb_constant_parameters(model: nn.Module, gen: torch.Generator, std: float = 0.1) -> None:
    """Add N(0, std) noise to every parameter initialized to one value (norm scales 1, biases 0).

    Trained models have no such parameters: with them a fused kernel that drops a LayerNorm scale
    or a bias would still be exact, and the dynamo optimizer merges identical initializers (every
    RMSNorm would share the first one's weight).
    """
    for param in model.parameters():
        flat = param.detach().reshape(-1)
        if flat.numel() and param.is_floating_point() and bool(torch.all(flat == flat[0])):
            param.add_(std * torch.randn(param.shape, generator=gen, dtype=param.dtype))


def build(spec: Spec) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model in eval mode and its example inputs, both from the model's own seed."""
    _torchvision()  # transformers imports torchvision too when it is installed
    torch.manual_seed(_seed(spec.name))
    model = spec.build()
    _perturb_constant_parameters(model, torch.Generator().manual_seed(_seed(spec.name) + 2))
    gen = torch.Generator().manual_seed(_seed(spec.name) + 1)
    if spec.bn_calibrate:
        _calibrate_batchnorm(model, spec, gen)
    model.eval()
    return model, spec.inputs(gen)


def _export_dynamo(
    model: nn.Module, spec: Spec, inputs: dict[str, torch.Tensor], optimize: bool
) -> onnx.ModelProto:
    dims: dict[str, torch.export.Dim] = {}
    for axes in spec.axes.values():
        for label in axes.values():
            if label not in dims:
                dims[label] = torch.export.Dim(label, min=1, max=spec.max_dims.get(label, 4096))
    shapes = {
        k: {i: dims[label] for i, label in spec.axes.get(k, {}).items()} or None for k in inputs
    }
    program = torch.onnx.export(
        model,
        (),
        kwargs=dict(inputs),
        dynamo=True,
        optimize=optimize,
        dynamic_shapes=shapes,
        input_names=list(inputs),
        output_names=[spec.output],
        report=False,
        verbose=False,
    )
    assert program is not None
    return program.model_proto


def _export_torchscript(
    model: nn.Module, spec: Spec, inputs: dict[str, torch.Tensor]
) -> onnx.ModelProto:
    buf = io.BytesIO()
    torch.onnx.export(
        model,
        tuple(inputs.values()),
        buf,
        dynamo=False,
        opset_version=TORCHSCRIPT_OPSET,
        input_names=list(inputs),
        output_names=[spec.output],
        dynamic_axes={**spec.axes, spec.output: spec.output_axes},
        verbose=False,
    )
    return onnx.load_from_string(buf.getvalue())


def _one_line(exc: BaseException) -> str:
    """``Outer: first sentence; cause: Inner: first line``, without colour codes or local paths."""

    def first(e: BaseException) -> str:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        return f"{type(e).__name__}: {line.split('. ')[0]}"

    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = first(exc) if inner is exc else f"{first(exc)}; cause: {first(inner)}"
    return re.sub(r"/\S*/site-packages/", "", text)[:400]


def _has_path(text: str) -> bool:
    return any(p.decode() in text for p in FORBIDDEN) or "site-packages" in text


def _scrub_graph(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
        for attr in node.attribute:
            if attr.HasField("g"):
                _scrub_graph(attr.g)
            for g in attr.graphs:
                _scrub_graph(g)
    for vi in (*graph.input, *graph.output, *graph.value_info):
        del vi.metadata_props[:]
        vi.doc_string = ""
    for init in graph.initializer:
        del init.metadata_props[:]
        init.doc_string = ""
    keep = [p for p in graph.metadata_props if not _has_path(p.key + p.value)]
    del graph.metadata_props[:]
    graph.metadata_props.extend(keep)
    graph.doc_string = ""


def scrub(model: onnx.ModelProto) -> onnx.ModelProto:
    """Clear node metadata (stack traces, module paths) and model/graph metadata naming a path."""
    _scrub_graph(model.graph)
    for fn in model.functions:
        for node in fn.node:
            del node.metadata_props[:]
            node.doc_string = ""
        del fn.metadata_props[:]
        fn.doc_string = ""
    keep = [p for p in model.metadata_props if not _has_path(p.key + p.value)]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.doc_string = ""
    return model


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    tt = vi.type.tensor_type
    shape = [d.dim_param if d.dim_param else d.dim_value for d in tt.shape.dim]
    return {
        "name": vi.name,
        "dtype": onnx.TensorProto.DataType.Name(tt.elem_type).lower(),
        "shape": shape,
    }


def _count_ops(graph: onnx.GraphProto, counts: Counter[str]) -> None:
    for node in graph.node:
        counts[
            node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        ] += 1
        for attr in node.attribute:
            if attr.HasField("g"):
                _count_ops(attr.g, counts)


def _ort_run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def export_one(
    spec: Spec,
    exporter: str,
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    expected: np.ndarray,
    out: Path,
) -> dict[str, Any]:
    """Export, scrub, save, check and run one file; returns its manifest entry."""
    fname = f"{spec.name}.{exporter}.onnx"
    entry: dict[str, Any] = {
        "file": fname,
        "model": spec.name,
        "family": spec.family,
        "source": spec.source,
        "description": spec.description,
        "exporter": exporter,
        "exported": False,
        "error": None,
    }
    path = out / fname
    for stale in (path, path.with_suffix(".inputs.npz"), path.with_suffix(".torch.npz")):
        stale.unlink(missing_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                proto = _export_torchscript(model, spec, inputs)
            else:
                proto = _export_dynamo(model, spec, inputs, optimize=exporter == "dynamo")
    except Exception as exc:  # noqa: BLE001 - the failure is recorded, not raised
        entry["error"] = _one_line(exc)
        return entry
    onnx.save(scrub(proto), str(path))
    data = path.read_bytes()
    for bad in FORBIDDEN:
        if bad in data:
            raise SystemExit(f"{fname} still contains {bad.decode()!r} after scrubbing")
    onnx.checker.check_model(str(path))
    model_proto = onnx.load(str(path))
    in_names = [vi.name for vi in model_proto.graph.input]
    out_names = [vi.name for vi in model_proto.graph.output]
    feeds = {k: inputs[k].numpy() for k in in_names}
    np.savez(path.with_suffix(".inputs.npz"), **feeds)
    np.savez(path.with_suffix(".torch.npz"), **{out_names[0]: expected})
    counts: Counter[str] = Counter()
    _count_ops(model_proto.graph, counts)
    entry.update(
        exported=True,
        opset=next(o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")),
        ir_version=model_proto.ir_version,
        nodes=len(model_proto.graph.node),
        functions=len(model_proto.functions),
        size_bytes=path.stat().st_size,
        inputs=[_value_info(vi) for vi in model_proto.graph.input],
        example_shapes={k: list(v.shape) for k, v in feeds.items()},
        outputs=[_value_info(vi) for vi in model_proto.graph.output],
        op_types=dict(sorted(counts.items())),
    )
    try:
        got = _ort_run(path, feeds)[out_names[0]]
        diff = float(np.max(np.abs(got.astype(np.float64) - expected)))
        scale = float(np.max(np.abs(expected)))
        entry.update(
            ort_max_abs_diff=diff, ort_max_rel_diff=diff / max(scale, 1e-30), torch_max_abs=scale
        )
    except Exception as exc:  # noqa: BLE001
        entry.update(ort_error=str(exc).splitlines()[0][:300])
    return entry


def export_model(spec: Spec, out: Path) -> list[dict[str, Any]]:
    """All three exports of one model."""
    model, inputs = build(spec)
    with torch.no_grad():
        expected = model(**inputs).numpy()
    entries = []
    for exporter in EXPORTERS:
        # Each exporter gets a fresh copy: the TorchScript tracer and torch.export may leave state.
        model, inputs = build(spec)
        entry = export_one(spec, exporter, model, inputs, expected, out)
        entries.append(entry)
        print(_row(entry), flush=True)
    return entries


def _row(e: dict[str, Any]) -> str:
    if not e["exported"]:
        return f"{e['file']:<40} FAILED  {e['error']}"
    rel = e.get("ort_max_rel_diff")
    diff = (
        f"abs {e['ort_max_abs_diff']:.2e} rel {rel:.2e}"
        if rel is not None
        else f"ORT: {e.get('ort_error')}"
    )
    size = f"{e['size_bytes'] / 1024:>7.0f} KiB"
    return f"{e['file']:<40} opset {e['opset']:>2} {e['nodes']:>5} nodes {size}  {diff}"


def _versions() -> dict[str, str]:
    import onnxruntime
    import onnxscript
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torchvision": _torchvision().__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=OUT, help="folder to write to (default: real/ here)"
    )
    parser.add_argument(
        "--only", choices=sorted(SPECS), action="append", help="export only this model"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    logging.getLogger("torch").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    manifest_path = args.out / "MANIFEST.json"
    old: list[dict[str, Any]] = []
    if args.only and manifest_path.exists():
        old = [
            e for e in json.loads(manifest_path.read_text())["files"] if e["model"] not in args.only
        ]
    entries = list(old)
    for name in args.only or SPECS:
        entries.extend(export_model(SPECS[name], args.out))
    order = {name: i for i, name in enumerate(SPECS)}
    entries.sort(key=lambda e: (order.get(e["model"], len(order)), EXPORTERS.index(e["exporter"])))
    manifest = {
        "generator": "search_spaces/models/export_real.py",
        "versions": _versions(),
        "notes": (
            "ort_max_rel_diff = max |onnxruntime - torch eager| / max |torch eager| over the "
            "output; "
            "inputs / outputs in <file stem>.inputs.npz / <file stem>.torch.npz"
        ),
        "files": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    failed = [e for e in entries if not e["exported"]]
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(
        f"{len(entries) - len(failed)} exported, {len(failed)} failed; "
        f"{args.out} holds {total / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
