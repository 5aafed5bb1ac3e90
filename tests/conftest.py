"""Session-wide test setup: one shared kernel cache, and the hypothesis profiles.

Kernel cache: a numba compile costs 0.1-1 s, and the tests compile a few hundred kernels. Every
test process (pytest, xdist workers, the subprocesses they start) shares one cache directory
inside the repository (git-ignored), so a kernel compiles once per machine, not once per run.
Tests that observe the cache itself (tests/codegen/test_cache.py) point their own subprocesses at
a fresh temporary directory instead.

Hypothesis profiles: ``default`` (25 derandomized examples, no deadline: the first example of a
shape compiles kernels), ``ci`` (the same examples, no example database, failing examples printed
as a reproducible blob) and ``thorough`` (many random examples, for hunting bugs locally). Pick one
with ``HYPOTHESIS_PROFILE=ci pytest``.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_CACHE_DIR = REPO_ROOT / ".fusiontune_cache" / "test-kernels"

# Set at import, before any test module runs: codegen reads the variable on every compile, and
# subprocesses started by tests inherit it.
os.environ["FUSIONTUNE_CACHE_DIR"] = str(TEST_CACHE_DIR)

_COMMON = dict(
    deadline=None,
    # Compiling a new kernel inside an example is slow by design; the example database is useless
    # when examples are derandomized.
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("default", max_examples=25, derandomize=True, **_COMMON)
settings.register_profile(
    "ci", max_examples=25, derandomize=True, database=None, print_blob=True, **_COMMON
)
settings.register_profile("thorough", max_examples=300, derandomize=False, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
