"""ReplayEvaluator: answer from a recorded table of (configuration -> result).

Kernel Tuner's replay of a recorded cache, for the search loop: comparing samplers on a grid
measured once costs milliseconds per trial, needs no compiler, and gives the same answer every
time. A configuration that is not in the table gets a failed result.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fusiontune.errors import UserError
from fusiontune.measure import METRICS
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus

NOT_RECORDED = "not in the recorded table"
_BISECT_JSON_DEPTH = 32  # a bisect.json nests about 8 levels (evaluations, result, fusion, ...)
_FIELDS = {f.name for f in dataclasses.fields(EvalResult)}


class ReplayEvaluator:
    """An evaluator that looks every configuration up by ``FusionConfig.key()``.

    Args:
        table: recorded results: an iterable of :class:`EvalResult` (keyed by their
            ``config_key``), a mapping config key -> EvalResult, or a pandas DataFrame with a
            ``config_key`` column and EvalResult columns (``median_s``, ``status``, the error
            metrics by name, ...); the first successful record of a key wins.
        workers: the batch size the tuning loop uses with this evaluator.
    """

    def __init__(self, table: Any, workers: int = 1) -> None:
        self.workers = workers
        self.table: dict[str, EvalResult] = {}
        records: Iterable[EvalResult]
        if hasattr(table, "to_dict") and hasattr(table, "columns"):
            records = _from_frame(table)
        elif isinstance(table, Mapping):
            records = (dataclasses.replace(r, config_key=k) for k, r in table.items())
        else:
            records = table
        for r in records:
            held = self.table.get(r.config_key)
            if held is None or (not held.ok and r.ok):
                self.table[r.config_key] = r
        self.calls = 0

    @classmethod
    def from_study(
        cls, storage_url: str, study_name: str | None = None, workers: int = 1
    ) -> ReplayEvaluator:
        """Replay the trials recorded in a study (their ``result`` user attrs).

        Trials that a stopped driver interrupted are left out: they measured nothing.

        Args:
            storage_url: the study's storage URL; a plain path to a ``study.db`` works too.
            study_name: the study; the only one in the storage when None.
            workers: the batch size the tuning loop uses with this evaluator.

        Raises:
            UserError: the storage cannot be opened or holds no such study.
        """
        import optuna

        from fusiontune.tune._storage import display_url, open_storage

        url = storage_url if "://" in storage_url else f"sqlite:///{storage_url}"
        storage = open_storage(url)
        names = optuna.get_all_study_names(storage)
        if study_name is None:
            if len(names) != 1:
                listed = ", ".join(names) or "none"
                raise UserError(
                    f"replay {display_url(url)}: name the study (studies there: {listed})"
                )
            study_name = names[0]
        if study_name not in names:
            raise UserError(
                f"replay {display_url(url)}: no study {study_name!r}"
                f" (studies there: {', '.join(names) or 'none'})"
            )
        from fusiontune.tune.store import StudyStore

        store = StudyStore(optuna.load_study(study_name=study_name, storage=storage))
        records = [
            t.result
            for t in store.trials()
            if t.result is not None and not t.interrupted and t.state in ("COMPLETE", "FAIL", "PRUNED")
        ]
        return cls(records, workers=workers)

    @classmethod
    def from_bisect(cls, path: str) -> ReplayEvaluator:
        """Replay the evaluations recorded in a ``bisect.json`` (keyed with their denied applications).

        Raises:
            UserError: the file is not a bisect.json.
        """
        from fusiontune.config.switch_file import check_json_depth
        from fusiontune.errors import read_user_file

        text = read_user_file(path)
        check_json_depth(text, str(path), max_depth=_BISECT_JSON_DEPTH)
        try:
            data = json.loads(text)
            records = [
                EvalResult.from_json(e["result"])
                for e in data["evaluations"]
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a bisect.json with recorded evaluations ({exc})") from None
        return cls(records)

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, config_key: object) -> bool:
        return config_key in self.table

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """The recorded result of each request's configuration, renumbered to its trial."""
        out = []
        for request in requests:
            self.calls += 1
            key = request.key()
            held = self.table.get(key)
            if held is None:
                out.append(
                    EvalResult(request.trial, key, "", EvalStatus.NOT_RECORDED, NOT_RECORDED, node="replay")
                )
                continue
            extra = {**dict(held.extra), "replayed_from": held.trial}
            out.append(dataclasses.replace(held, trial=request.trial, extra=extra))
        return out

    def close(self) -> None:
        return None


def _from_frame(frame: Any) -> list[EvalResult]:
    """EvalResults from DataFrame rows: EvalResult columns, error metrics by name."""
    if "config_key" not in frame.columns:
        raise ValueError("a replay table needs a config_key column")
    out = []
    for row in frame.to_dict("records"):
        if isinstance(row.get("result"), Mapping):
            out.append(EvalResult.from_json(row["result"]))
            continue
        fields: dict[str, Any] = {k: v for k, v in row.items() if k in _FIELDS and not _missing(v)}
        errors = {m: float(row[m]) for m in METRICS if m in row and not _missing(row[m])}
        fields.setdefault("errors", errors)
        fields.setdefault("trial", -1)
        fields.setdefault("program_hash", "")
        ok = "median_s" in fields
        fields["status"] = fields.get("status") or (EvalStatus.OK if ok else EvalStatus.RUN_FAILED)
        for name in ("trial", "kernels", "peak_bytes", "attempts"):
            if name in fields:
                fields[name] = int(fields[name])
        out.append(EvalResult.from_json(fields))
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
