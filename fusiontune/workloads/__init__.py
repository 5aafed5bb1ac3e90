"""Workloads: built-in graphs with their inputs and float64 reference outputs."""

from fusiontune.workloads.builtin import WORKLOADS, list_workloads, make_workload
from fusiontune.workloads.workload import InputSpec, Workload, WorkloadSpec, build_workload

__all__ = [
    "WORKLOADS",
    "InputSpec",
    "Workload",
    "WorkloadSpec",
    "build_workload",
    "list_workloads",
    "make_workload",
]
