"""Runtime: a Program runs compiled kernels in order over a preallocated, reused buffer plan."""

from fusiontune.runtime.program import (
    BufferPlan,
    KernelInfo,
    Program,
    build_program,
    plan_buffers,
    precompile,
)

__all__ = ["BufferPlan", "KernelInfo", "Program", "build_program", "plan_buffers", "precompile"]
