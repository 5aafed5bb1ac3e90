"""Catalogue ops for the logic, comparison and elementwise ops real exporters emit on live data.

Each op is registered into :data:`fusiontune.ir.ops.CATALOGUE` with its kind, shape rule and
numpy reference, exactly like the ops of ``ops.py``.
"""

from __future__ import annotations
