"""ONNX converters for the logic, comparison and elementwise ops (see ``_ops_logic``)."""

from __future__ import annotations
