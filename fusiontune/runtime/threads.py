"""One thread pool per process: numba's.

Kernels call BLAS (``np.dot``) from inside numba's parallel loops, one row chunk per thread. If
OpenBLAS kept its own threads too, two pools would spin against each other on the same cores: on a
2-core machine a program of MatMuls and elementwise kernels ran 50x slower than its kernels timed
one by one. So BLAS is limited to one thread for the life of the process.
"""

from __future__ import annotations

import threadpoolctl

_LIMITER: threadpoolctl.threadpool_limits | None = None


def single_threaded_blas() -> None:
    """Limit every loaded BLAS library to one thread (idempotent)."""
    global _LIMITER
    if _LIMITER is None:
        import scipy.linalg.cython_blas  # noqa: F401  (load numba's BLAS before limiting it)

        _LIMITER = threadpoolctl.threadpool_limits(limits=1, user_api="blas")
