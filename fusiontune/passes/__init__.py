"""Fusion passes: the contract, the one registry table, the passes and the pipeline."""

from fusiontune.passes.base import (
    Application,
    FusionReport,
    PassContext,
    PassInfo,
    PatternStat,
    SplitPoint,
)
from fusiontune.passes.fused_graph import FusedGraph, Group
from fusiontune.passes.registry import BY_NAME, PASSES, closest, lookup

__all__ = [
    "BY_NAME",
    "PASSES",
    "Application",
    "FusedGraph",
    "FusionReport",
    "Group",
    "PassContext",
    "PassInfo",
    "PatternStat",
    "SplitPoint",
    "closest",
    "lookup",
]
