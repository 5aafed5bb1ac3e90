"""``python -m fusiontune``: the same as the ``fusiontune`` console script."""

from __future__ import annotations

from fusiontune.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
