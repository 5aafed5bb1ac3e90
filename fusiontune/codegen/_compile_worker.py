"""A child of a parallel build: ``python -m fusiontune.codegen._compile_worker TASKDIR``.

Compiles into the disk cache every kernel of ``TASKDIR/tasks.json`` that it claims first
(:func:`fusiontune.codegen.cache.claim_tasks`), and writes each one's compile seconds to
``TASKDIR/<key>.s``. A kernel that fails to compile is left to the parent, which raises its error
in order. The child stops when its parent is gone.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fusiontune.codegen.cache import claim_tasks, compile_kernel


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    parent = os.getppid()
    for task in claim_tasks(work):
        if os.getppid() != parent:
            return 1
        t0 = time.perf_counter()
        try:
            compile_kernel(task)
        except Exception:
            continue
        (work / f"{task.key}.s").write_text(repr(time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
