"""Code generation: fused group -> numba source -> compiled kernel, cached by source hash."""

# First, before anything below compiles or loads numba code: the vector width numba's loops get.
from fusiontune.codegen import target as _target  # noqa: F401  (configures numba on import)
from fusiontune.codegen.cache import CompiledKernel, cache_dir, compile_kernel
from fusiontune.codegen.common import ArgSpec, KernelSource, NotFusable
from fusiontune.codegen.plan import check_fusable, group_sources, kernel_source

__all__ = [
    "ArgSpec",
    "CompiledKernel",
    "KernelSource",
    "NotFusable",
    "cache_dir",
    "check_fusable",
    "compile_kernel",
    "group_sources",
    "kernel_source",
]
