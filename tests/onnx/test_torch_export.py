"""Small torch models exported with torch.onnx.export: imported, run, and compared with onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from fusiontune.config.fusion_config import FusionConfig  # noqa: E402
from fusiontune.ir.interpreter import run_graph  # noqa: E402
from fusiontune.ir.onnx_import import import_onnx  # noqa: E402
from fusiontune.passes.pipeline import run_pipeline  # noqa: E402
from fusiontune.runtime import build_program  # noqa: E402


class ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, stride=2)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # non-trivial running statistics
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TinyAttention(torch.nn.Module):
    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1)

        def heads(t):
            return t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        p = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
        y = (p @ v).transpose(1, 2).reshape(b, s, h)
        return self.norm(x + self.out(y))


def export(module: torch.nn.Module, example: torch.Tensor, path: Path) -> Path:
    module.eval()
    kwargs = {"dynamo": False} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
    torch.onnx.export(module, (example,), str(path), input_names=["x"], output_names=["y"], opset_version=17, **kwargs)
    return path


@pytest.mark.parametrize(
    "module, shape",
    [(ConvBnRelu, (2, 3, 9, 9)), (Mlp, (4, 16)), (TinyAttention, (2, 5, 16))],
    ids=["conv_bn_relu", "mlp_gelu", "tiny_attention"],
)
def test_torch_export_matches_onnxruntime(module: type, shape: tuple[int, ...], tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape)
    path = export(module(), x, tmp_path / f"{module.__name__}.onnx")
    feeds = {"x": x.numpy()}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = import_onnx(path)
    assert graph.outputs == ("y",)
    np.testing.assert_allclose(run_graph(graph, feeds)["y"], want, rtol=1e-4, atol=1e-5)
    program = build_program(run_pipeline(graph, FusionConfig.defaults()).fused)
    np.testing.assert_allclose(np.array(program.run(feeds)["y"]), want, rtol=1e-4, atol=1e-4)
