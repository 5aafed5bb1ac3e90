"""ONNX converters for the index, layout and window ops (see ``_ops_index``)."""

from __future__ import annotations
