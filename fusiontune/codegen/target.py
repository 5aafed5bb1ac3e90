"""The machine numba compiles kernels for: its vector width, and the name of that target.

LLVM tunes for Intel's server cores since Skylake-X (``skylake-avx512`` up to ``emeraldrapids``
and ``graniterapids``) with ``prefer-256-bit``: its loop vectorizer then uses 256-bit vectors on a
CPU that has 512-bit ones, because those cores once lowered their clock for 512-bit work. A
numba loop (a kernel's input copy, its epilogue, a depthwise conv, a pool) therefore ran 8 float32
lanes where 16 fit. :func:`configure_target` takes the preference away before numba creates its
code generator, so those loops use the whole register: on the 2-core Emerald Rapids VM, one
thread, ResNet18's TorchScript export 0.249 -> 0.221 ms and MobileNetV3's 0.227 -> 0.199,
SqueezeNet's 0.168 -> 0.173, the other three measured within 1% (two runs one after the other, not
interleaved: numba fixes its features per process); the conv and MatMul micro-kernels, written in
LLVM IR for the full width, are unchanged. AMD's cores have no such preference, and nothing changes there.

numba reads its CPU name and features once, when its first compile or cache load creates the
code generator, from ``numba.config.CPU_NAME`` / ``CPU_FEATURES`` (the ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` environment variables). So this module calls :func:`configure_target` when
it is imported, which ``fusiontune.codegen`` does before anything else, and it leaves everything as it is when the user set either variable, when the code
generator already exists (a program compiled numba code before importing fusiontune), or with
``FUSIONTUNE_VECTOR_WIDTH=256``.

:func:`target_tag` names the target kernels are compiled for: the disk cache keeps one folder per
tag (codegen/cache.py), because numba's machine code for one CPU is not the code for another, and
two processes compiling the same kernel for two targets into one folder would each find the
other's files "damaged".
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os

import llvmlite.binding as llvm
import numba
from numba.core import registry

_LOG = logging.getLogger(__name__)

VECTOR_WIDTH_ENV = "FUSIONTUNE_VECTOR_WIDTH"
_PREFER_256 = "prefer-256-bit"


def _host_features() -> str:
    return str(llvm.get_host_cpu_features().flatten())


def _codegen_created() -> bool:
    return "_toplevel_target_context" in vars(registry.cpu_target)


def configure_target() -> bool:
    """Let numba vectorize with the CPU's widest registers (idempotent; see the module docstring).

    A ``FUSIONTUNE_VECTOR_WIDTH`` other than 256 or 512 is warned about once and ignored (this
    runs as the package is imported, before any command could report it as an error).

    Returns:
        True when this call (or an earlier one) set numba's CPU features, False when it left them.
    """
    width = os.environ.get(VECTOR_WIDTH_ENV, "").strip()
    if width not in ("", "256", "512"):
        _LOG.warning("%s=%r: expected 256 or 512; ignored", VECTOR_WIDTH_ENV, width)
    cfg = numba.config
    if cfg.CPU_FEATURES is not None:
        return bool(cfg.CPU_FEATURES.endswith(f",-{_PREFER_256}"))
    if width == "256" or cfg.CPU_NAME is not None or _codegen_created():
        return False
    features = _host_features()
    if "+avx512f" not in features.split(","):
        return False
    cfg.CPU_FEATURES = f"{features},-{_PREFER_256}"
    return True


def target_features() -> frozenset[str] | None:
    """The CPU features numba compiles for (``avx512f``...), or None when a CPU name was forced
    without features (its features are LLVM's for that name, not known here)."""
    cfg = numba.config
    if cfg.CPU_FEATURES is not None:
        features = cfg.CPU_FEATURES
    elif cfg.CPU_NAME is None:
        features = _host_features()
    else:
        return None
    return frozenset(f[1:] for f in features.split(",") if f.startswith("+"))


@functools.cache
def target_tag() -> str:
    """The CPU kernels are compiled for, as a folder name: ``<cpu name>-<hash of its features>``.

    Computed once per process (128 us a call, and the kernel cache asks on every load): numba
    fixes its target when its code generator is made, after :func:`configure_target` has run."""
    cfg = numba.config
    name = cfg.CPU_NAME or llvm.get_host_cpu_name()
    features = cfg.CPU_FEATURES if cfg.CPU_FEATURES is not None else _host_features()
    digest = hashlib.sha256(f"{llvm.get_process_triple()}|{name}|{features}".encode()).hexdigest()[:10]
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "generic"
    return f"{safe}-{digest}"


configure_target()


L2_FALLBACK_BYTES = 1024 * 1024
"""The L2 size assumed where the kernel reports none (no sysfs, another OS)."""


@functools.cache
def l2_bytes() -> int:
    """The data (or unified) L2 cache of one core, from Linux's sysfs; :data:`L2_FALLBACK_BYTES`
    where it cannot be read. Kernels size their per-task working sets from it: 2 MiB on the Intel
    server cores these kernels were measured on, 512 KiB on AMD's Zen cores."""
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(folder)):
            path = os.path.join(folder, index)
            if not index.startswith("index"):
                continue
            with open(os.path.join(path, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Data", "Unified"):
                with open(os.path.join(path, "size")) as f:
                    size = f.read().strip()
                scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return L2_FALLBACK_BYTES
