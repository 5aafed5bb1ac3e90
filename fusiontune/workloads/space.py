"""SearchSpace: what a ``search_spaces/*.toml`` file says a sweep is, and the loader that checks it.

The file names the workload, the passes searched and held fixed, the split-point values, the
accuracy bound, the timing protocol and the search budget (``search_spaces/README.md`` documents
every key). Loading validates all of it against the registry and the workload table before any
trial runs: anything wrong is one :class:`SpaceError` line ``<file>: <key path>: <what is wrong>``.

The search dimensions use the storage names of the optuna study: ``pass.<Pass>`` ("off" / "on") for
each searched pass and ``split.<Pass>.<point>`` (int) for each split point with more than one
value. :func:`config_from_params` turns a trial's parameters into a :class:`FusionConfig`, and
:func:`params_from_config` projects a configuration back (the enqueued baselines).

A space with a ``[target]`` table (``kind = "command"``) tunes the user's own job instead of a
built-in workload (:mod:`fusiontune.workloads.target`): its ``[passes]`` list the job's passes by
kind, its configurations resolve against that table (``FusionConfig.passes``), and the bounded
metric is the ``error`` the job reports.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from fusiontune.config.fusion_config import FusionConfig, JobPass
from fusiontune.errors import UserError, read_user_file
from fusiontune.ir.graph import Graph
from fusiontune.ir.training import LOSSES, OPTIMIZERS, TrainSpec, loss_output
from fusiontune.measure import METRICS, MeasureConfig
from fusiontune.passes.base import PassInfo, SplitPoint
from fusiontune.passes.registry import PASSES, closest, lookup
from fusiontune.workloads.builtin import WORKLOADS, graph_shapes
from fusiontune.workloads.onnx_model import InputFileError, OnnxSource, file_inputs
from fusiontune.workloads.target import CommandTarget, load_job_passes, load_target
from fusiontune.workloads.target import toml_kind as _kind

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

SAMPLERS = ("tpe", "random", "grid", "nsga2", "fusion")
"""Sampler names a space (or ``--sampler``) may choose; the tune loop maps them to optuna samplers."""

PASS_PARAM = "pass."
SPLIT_PARAM = "split."
ON_OFF = ("off", "on")
MAX_SPLIT_VALUES = 64  # a categorical with more values than this is not searchable in 40 trials
MAX_GRID_SIZE = 10_000  # optuna's GridSampler materializes the whole grid
MAX_TOML_DEPTH = 8  # a space nests 3 levels at most ([target.metrics] runtime = "..."); see _check_depth

_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
STUDY_NAME_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)")


def is_study_name(name: object) -> bool:
    """Whether ``name`` may name a study, and so the folder ``results/<name>/``.

    The rule of a space's ``name``, of ``--study`` and of ``bisect --name``: :data:`STUDY_NAME_RULE`.
    No ``/``, so no absolute path, no ``..`` and no subfolder can leave ``results/``.
    """
    return isinstance(name, str) and _STUDY_NAME.fullmatch(name) is not None
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TRAIN_KEYS = ("train", "loss", "loss_output", "optimizer", "lr")
"""The keys of ``[workload]`` that make it a training step."""
_SECTIONS = ("name", "workload", "target", "passes", "split_points", "accuracy", "measure", "search")
_SEARCH_KEYS = (
    "sampler",
    "trials",
    "timeout",
    "seed",
    "top_k",
    "workers",
    "trial_timeout",
    "baseline_every",
    "baseline_minutes",
)
COMMAND_METRIC = "error"
"""The bounded metric of a command target: the error the job reports."""


class SpaceError(UserError, ValueError):
    """A search space that cannot be used: one line ``<file>: <key path>: <what is wrong>``."""


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space.

    Attributes:
        path: the file it came from.
        name: the study name used by default (the file's stem unless set).
        workload: a built-in workload name, or the stem of the ONNX model in ``onnx``.
        sizes: the workload's size parameters (an ONNX model: its fixed symbolic dimensions).
        searched: pass names whose on/off is a search dimension (``pass.<Name>``).
        fixed: pass name -> on/off for passes held fixed during the search.
        splits: ``"Pass.point"`` -> the values searched (``split.<Pass>.<point>``); a single value
            fixes it.
        metric: the error metric bounded (max_abs, max_rel, rel_l2, cosine).
        bound: the accuracy bound: a configuration is feasible when ``error <= bound``.
        measure: the measurement protocol.
        sampler: tpe | random | grid | nsga2 | fusion (a model of main effects and pairwise
            interactions with a feasibility model: :mod:`fusiontune.tune.fusion_sampler`).
        trials: the default trial budget.
        timeout_s: the default wall-time budget, seconds (None: no limit).
        seed: the sampler seed.
        top_k: how many configurations the confirmation stage measures again.
        workers: default number of Ray workers (0: in process).
        trial_timeout_s: a trial running longer than this fails.
        baseline_every: the sweep measures the defaults and all-off again every this many trials
            (0: only when it starts), so that every speedup is against a baseline of its window.
        baseline_minutes: ... and every this many minutes (0: no time limit).
        target: the user's job when the space tunes one (``[target] kind = "command"``); then
            ``workload`` is empty, ``searched`` and ``fixed`` name the job's passes, there are no
            split points, and ``metric`` is ``"error"``. None: the built-in ``workload``.
        onnx: the ONNX model the space tunes (``[workload] onnx = "model.onnx"``, and optionally
            ``inputs = "arrays.npz"``, the arrays it runs on), its paths made absolute; None for a
            built-in workload. Build either kind with
            :func:`fusiontune.workloads.onnx_model.space_workload`.
        train: the training step the space tunes (``[workload] train = true``, with ``loss``,
            ``optimizer`` and ``lr``); None: the model's inference.
    """

    path: str
    name: str
    workload: str
    sizes: Mapping[str, int]
    searched: tuple[str, ...]
    fixed: Mapping[str, bool]
    splits: Mapping[str, tuple[int, ...]]
    metric: str = "max_rel"
    bound: float = 1e-3
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    sampler: str = "fusion"
    trials: int = 40
    timeout_s: float | None = None
    seed: int = 0
    top_k: int = 5
    workers: int = 2
    trial_timeout_s: float = 300.0
    baseline_every: int = 25
    baseline_minutes: float = 30.0
    target: CommandTarget | None = None
    onnx: OnnxSource | None = None
    train: TrainSpec | None = None

    @property
    def passes(self) -> tuple[JobPass, ...] | None:
        """The job's pass table of a command target; None for a built-in workload."""
        return self.target.passes if self.target is not None else None

    def __post_init__(self) -> None:
        object.__setattr__(self, "searched", tuple(self.searched))
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))
        splits = {k: tuple(v) for k, v in sorted(self.splits.items())}
        object.__setattr__(self, "splits", MappingProxyType(splits))

    def __reduce__(self) -> tuple[Any, ...]:
        # mappingproxy does not pickle; Ray ships the space to its actors.
        args = [getattr(self, f.name) for f in fields(self)]
        return (SearchSpace, tuple(dict(a) if isinstance(a, Mapping) else a for a in args))


# ---- loading -------------------------------------------------------------------------------------
def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space TOML file.

    Args:
        path: the file; error messages name it as given.

    Returns:
        The validated space.

    Raises:
        SpaceError: an unreadable file, malformed TOML (with line and column), or any key that is
            unknown, of the wrong type, or out of range: one line naming the file and the key.
    """
    source = str(path)
    text = read_user_file(path, SpaceError, "a .toml file")
    return loads_space(text, source)


def loads_space(text: str, path: str = "<space>") -> SearchSpace:
    """Validate the text of a search-space file (the report rebuilds a study's space from it).

    Args:
        text: the TOML text.
        path: the file it came from, for error messages and :attr:`SearchSpace.path`.

    Returns:
        The validated space.

    Raises:
        SpaceError: as :func:`load_space`.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: thousands of levels end here
        raise SpaceError(
            f"{path}: nested too deeply for the TOML parser (a search space nests 3 levels of"
            f" tables and arrays, {MAX_TOML_DEPTH} are accepted); nothing was read"
        ) from None
    _check_depth(data, path)
    return _Loader(path).space(data)


def _check_depth(data: Mapping[str, Any], path: str) -> None:
    """Refuse values nested deeper than :data:`MAX_TOML_DEPTH`, naming the first such key.

    Walked with a stack, not recursion, so the check itself cannot overflow; every reader after
    it (the loader, the report's TOML echo) may then recurse freely.
    """
    stack: list[tuple[str, Any, int]] = [(k, v, 1) for k, v in data.items()]
    while stack:
        key, value, depth = stack.pop()
        if depth > MAX_TOML_DEPTH:
            raise SpaceError(
                f"{path}: {key}: nested deeper than {MAX_TOML_DEPTH} levels of tables and arrays"
            )
        if isinstance(value, Mapping):
            stack.extend((f"{key}.{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))


def parse_duration(value: str | float, key: str | None = None) -> float:
    """Seconds in a duration: ``"30s"``, ``"10m"``, ``"8h"``, ``"1d"``, ``"1h30m"``, ``"500ms"``, or seconds.

    Args:
        value: a string with units (summed, so ``"1h30m"`` is 5400), a bare number string, or a
            number of seconds.
        key: what the value is for (``--timeout``, ``search.timeout``), prefixed to the message.

    Returns:
        The duration in seconds, positive and finite.

    Raises:
        SpaceError: anything else, e.g. ``"8x"``, ``"-5m"``, ``0``.
    """
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if parts and re.fullmatch(rf"(?:\s*{_DURATION_PART.pattern})+", text):
                seconds = sum(float(n) * _UNIT_S[unit] for n, unit in parts)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        where = f"{key}: " if key else ""
        raise SpaceError(
            f"{where}invalid duration {value!r}: expected a positive number of seconds or a number"
            " with a unit (ms, s, m, h, d), e.g. 30s, 10m, 8h, 1h30m"
        )
    return seconds


# ---- search dimensions ---------------------------------------------------------------------------
def param_names(space: SearchSpace) -> list[str]:
    """The names of the search dimensions: ``pass.<Pass>`` in registry order, then ``split.<key>``.

    Args:
        space: the space.

    Returns:
        The parameter names a trial of this space has.
    """
    return [PASS_PARAM + name for name in space.searched] + [
        SPLIT_PARAM + key for key, values in space.splits.items() if len(values) > 1
    ]


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The optuna distribution of every search dimension, for ``study.ask(fixed_distributions)``.

    Args:
        space: the space.

    Returns:
        ``pass.<Pass>`` -> ``CategoricalDistribution(["off", "on"])``, ``split.<Pass>.<point>``
        -> ``CategoricalDistribution`` over the space's integer values, in :func:`param_names` order.
    """
    from optuna.distributions import CategoricalDistribution

    out: dict[str, BaseDistribution] = {}
    for name in param_names(space):
        if name.startswith(PASS_PARAM):
            out[name] = CategoricalDistribution(list(ON_OFF))
        else:
            out[name] = CategoricalDistribution(list(space.splits[name[len(SPLIT_PARAM) :]]))
    return out


def grid_size(space: SearchSpace) -> int:
    """How many distinct parameter assignments the space has (what a grid sampler would run)."""
    return math.prod([2] * len(space.searched) + [len(v) for v in space.splits.values()])


def config_from_params(space: SearchSpace, params: Mapping[str, object]) -> FusionConfig:
    """The configuration a trial's parameters describe.

    Passes that are not searched take their fixed value or the registry default; split points
    that are not dimensions take their single value.

    Args:
        space: the space the parameters belong to.
        params: every dimension of :func:`param_names`: ``pass.<Pass>`` -> "on" / "off",
            ``split.<Pass>.<point>`` -> one of the space's values.

    Returns:
        The resolved configuration.

    Raises:
        SpaceError: a parameter that is not a dimension of this space, a missing one, or a value
            outside its dimension (a study made with another version of the file).
    """
    explicit: dict[str, bool] = dict(space.fixed)
    splits = {key: values[0] for key, values in space.splits.items() if len(values) == 1}
    dims = dimension_choices(space)
    for name, value in params.items():
        choices = dims.get(name)
        if choices is None:
            raise SpaceError(f"{space.path}: params: {name!r} is not a dimension of this space")
        if isinstance(value, bool) or value not in choices:
            raise SpaceError(
                f"{space.path}: params: {name} = {value!r} is not one of {list(choices)}"
            )
        if name.startswith(PASS_PARAM):
            explicit[name[len(PASS_PARAM) :]] = value == "on"
        else:
            splits[name[len(SPLIT_PARAM) :]] = int(value)  # type: ignore[call-overload]
    missing = [name for name in dims if name not in params]
    if missing:
        raise SpaceError(f"{space.path}: params: missing {', '.join(missing)}")
    return FusionConfig.resolve(
        explicit=explicit, split_points=splits, source=space.path, passes=space.passes
    )


def params_from_config(space: SearchSpace, config: FusionConfig) -> dict[str, object]:
    """The parameters of ``config`` in this space (the inverse of :func:`config_from_params`).

    What the space holds fixed is dropped: the result is ``config`` projected on the searched
    passes and split points. This is how the baselines are enqueued (:func:`baseline_params`).

    Args:
        space: the space.
        config: a resolved configuration.

    Returns:
        One entry per dimension of :func:`param_names`.

    Raises:
        SpaceError: a split value of ``config`` that is not among the space's values.
    """
    out: dict[str, object] = {}
    for name in param_names(space):
        if name.startswith(PASS_PARAM):
            out[name] = ON_OFF[config.switches[name[len(PASS_PARAM) :]]]
        else:
            key = name[len(SPLIT_PARAM) :]
            value = config.split_points[key]
            if value not in space.splits[key]:
                raise SpaceError(
                    f"{space.path}: split_points.{_key(key)}: {value} is not among the searched"
                    f" values {list(space.splits[key])}"
                )
            out[name] = value
    return out


ONLY_ROLE = "only:"
"""Role prefix of the attribution trials: ``only:<Pass>`` is the defaults with one inexact pass on."""


def baseline_params(space: SearchSpace) -> dict[str, dict[str, object]]:
    """The trials enqueued first, by role: ``defaults``, ``all_off``, then one per inexact pass.

    ``defaults``: the registry defaults, split points 0. ``all_off``: every searched pass off,
    split points 0. ``only:<Pass>``, for each inexact pass the space searches: the defaults with
    that pass on (and every other inexact pass off), which gives the report's accuracy
    attribution: the error each speed-for-accuracy trade costs on its own. Passes the space does
    not search keep their fixed or default value in all of them.
    """
    out = {
        "defaults": params_from_config(space, FusionConfig.defaults(space.passes)),
        "all_off": params_from_config(space, FusionConfig.all_off(space.passes)),
    }
    for name in inexact_searched(space):
        out[ONLY_ROLE + name] = params_from_config(space, FusionConfig.defaults().with_switches(**{name: True}))
    return out


def inexact_searched(space: SearchSpace) -> list[str]:
    """The inexact passes (``exact = false``) whose switch the space searches, in registry order.

    A command target's passes are the job's, which fusiontune knows nothing about: none.
    """
    if space.target is not None:
        return []
    return [p.name for p in PASSES if not p.exact and p.name in space.searched]


def dimension_choices(space: SearchSpace) -> dict[str, tuple[object, ...]]:
    """Each dimension's values, without importing optuna: ``pass.*`` -> ("off", "on"), ``split.*`` -> ints."""
    return {
        name: ON_OFF if name.startswith(PASS_PARAM) else space.splits[name[len(SPLIT_PARAM) :]]
        for name in param_names(space)
    }


# ---- the validator -------------------------------------------------------------------------------
def _key(*parts: str | int) -> str:
    """A TOML key path: bare keys as they are, others quoted, array indices as ``[i]``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.fullmatch(part) else '"' + part.replace('"', '\\"') + '"'
            out += f".{text}" if out else text
    return out


class _Loader:
    """Walks the parsed TOML once, section by section; every failure names the file and the key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> NoReturn:
        raise SpaceError(f"{self.path}: {key}: {message}")

    def table(
        self, data: Mapping[str, Any], name: str, known: tuple[str, ...], prefix: str = ""
    ) -> dict[str, Any]:
        value = data.get(name, {})
        key = f"{prefix}.{name}" if prefix else name
        if not isinstance(value, dict):
            self.fail(key, f"expected a table, got {_kind(value)}")
        self.known(value, known, key)
        return value

    def known(self, table: Mapping[str, Any], known: tuple[str, ...], prefix: str = "") -> None:
        for name in table:
            if name not in known:
                where = f"{prefix}.{_key(name)}" if prefix else _key(name)
                self.fail(where, f"unknown key (known: {', '.join(known)})")

    def integer(self, value: object, key: str, low: int = 0, high: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(key, f"expected an integer, got {_kind(value)}")
        if value < low:
            self.fail(key, f"must be >= {low}, got {value}")
        if high is not None and value > high:
            self.fail(key, f"must be <= {high}, got {value}")
        return value

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"expected true or false, got {_kind(value)}")
        return value

    def number(self, value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {_kind(value)}")
        if not math.isfinite(value) or value < 0:
            self.fail(key, f"must be a finite number >= 0, got {value}")
        return float(value)

    def choice(self, value: object, key: str, known: tuple[str, ...], what: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_kind(value)}")
        if value not in known:
            close = difflib.get_close_matches(value, known, n=2, cutoff=0.3)
            hint = f"closest: {', '.join(close)}; " if close else ""
            self.fail(key, f"unknown {what} {value!r} ({hint}known: {', '.join(known)})")
        return value

    def pass_info(self, name: object, key: str) -> PassInfo:
        if not isinstance(name, str):
            self.fail(key, f"expected a pass name, got {_kind(name)}")
        info = lookup(name)
        if info is None:
            self.fail(
                key, f"unknown pass {name!r} (closest known: {', '.join(closest(name)) or 'none'})"
            )
        return info

    # ---- sections -----------------------------------------------------------------------------
    def space(self, data: dict[str, Any]) -> SearchSpace:
        self.known(data, _SECTIONS)
        name = data.get("name", Path(self.path).stem)
        if not is_study_name(name):
            self.fail("name", f"expected a study name of {STUDY_NAME_RULE}, got {name!r}")
        if "target" in data:
            return self.command_space(data, name)
        if "workload" not in data:
            self.fail(
                "workload",
                'missing: add [workload] with name = "<a built-in workload>", or a [target] to'
                " tune your own job",
            )
        table = self.table(data, "workload", ("name", "sizes", "onnx", "dims", "input_shapes", "inputs", *_TRAIN_KEYS))
        workload, sizes, onnx, graph = self.workload(table)
        train = self.train(table, graph)
        searched, fixed = self.passes(self.table(data, "passes", ("search", "fixed")))
        splits = self.split_points(data.get("split_points", {}), searched, fixed)
        accuracy = self.table(data, "accuracy", ("metric", "bound"))
        metric = self.choice(
            accuracy.get("metric", "max_rel"), "accuracy.metric", METRICS, "metric"
        )
        bound = self.number(accuracy.get("bound", 1e-3), "accuracy.bound")
        measure = self.measure(
            self.table(data, "measure", tuple(f.name for f in fields(MeasureConfig)))
        )
        search = self.table(data, "search", _SEARCH_KEYS)
        space = SearchSpace(
            path=self.path,
            name=name,
            workload=workload,
            sizes=sizes,
            searched=searched,
            fixed=fixed,
            splits=splits,
            metric=metric,
            bound=bound,
            measure=measure,
            trial_timeout_s=self.duration(
                search.get("trial_timeout", 300.0), "search.trial_timeout"
            ),
            **self.search(search, top_k=5, workers=2),
            onnx=onnx,
            train=train,
        )
        size = grid_size(space)
        if size == 1:
            self.fail(
                "passes.search",
                "the space has no search dimension: search a pass or give a split point two values",
            )
        return self.check_grid(space)

    def check_grid(self, space: SearchSpace) -> SearchSpace:
        size = grid_size(space)
        if space.sampler == "grid" and size > MAX_GRID_SIZE:
            self.fail(
                "search.sampler",
                f"grid needs a small space, this one has {size} configurations (at most"
                f" {MAX_GRID_SIZE}): use tpe or random, or search fewer passes and split values",
            )
        return space

    def search(self, search: dict[str, Any], top_k: int, workers: int) -> dict[str, Any]:
        """The ``[search]`` fields every space has; ``top_k`` and ``workers`` are the defaults."""
        timeout = search.get("timeout")
        return {
            "sampler": self.choice(search.get("sampler", "fusion"), "search.sampler", SAMPLERS, "sampler"),
            "trials": self.integer(search.get("trials", 40), "search.trials", low=1),
            "timeout_s": None if timeout is None else self.duration(timeout, "search.timeout"),
            "seed": self.integer(search.get("seed", 0), "search.seed", high=2**32 - 1),
            "top_k": self.integer(search.get("top_k", top_k), "search.top_k", low=1),
            "workers": self.integer(search.get("workers", workers), "search.workers"),
            "baseline_every": self.integer(search.get("baseline_every", 25), "search.baseline_every"),
            "baseline_minutes": self.number(search.get("baseline_minutes", 30.0), "search.baseline_minutes"),
        }

    def command_space(self, data: dict[str, Any], name: str) -> SearchSpace:
        """A space whose target is the user's own job (``[target] kind = "command"``)."""
        for section, why in (
            ("workload", "a space tunes either a built-in [workload] or your own job ([target])"),
            ("split_points", "split points are searched on the built-in target only"),
            ("measure", "a command target times itself: see target.repeats and target.metrics"),
        ):
            if section in data:
                self.fail(section, f"not used with a command target: {why}")
        target_table = data["target"]
        if not isinstance(target_table, dict):
            self.fail("target", f"expected a table, got {_kind(target_table)}")
        passes_table = data.get("passes", {})
        if not isinstance(passes_table, dict):
            self.fail("passes", f"expected a table, got {_kind(passes_table)}")
        passes, searched, fixed = load_job_passes(passes_table, self.fail)
        target = load_target(target_table, passes, self.path, self.fail)
        accuracy = self.table(data, "accuracy", ("metric", "bound"))
        if "metric" in accuracy and accuracy["metric"] != COMMAND_METRIC:
            self.fail(
                "accuracy.metric",
                "not used with a command target: the job's error (target.metrics.error) is bounded",
            )
        search = self.table(data, "search", _SEARCH_KEYS)
        if "trial_timeout" in search:
            self.fail("search.trial_timeout", "not used with a command target: set target.timeout_s")
        if not searched:
            self.fail("passes", "no pass to search: every listed pass is fixed or not switchable")
        space = SearchSpace(
            path=self.path,
            name=name,
            workload="",
            sizes={},
            searched=searched,
            fixed=fixed,
            splits={},
            metric=COMMAND_METRIC,
            bound=self.number(accuracy.get("bound", 1e-3), "accuracy.bound"),
            trial_timeout_s=target.timeout_s * target.repeats,
            **self.search(search, top_k=3, workers=0),
            target=target,
        )
        return self.check_grid(space)

    def duration(self, value: object, key: str) -> float:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(key, f'expected a duration like "10m" or seconds, got {_kind(value)}')
        try:
            return parse_duration(value)
        except SpaceError as e:
            self.fail(key, str(e))

    def measure(self, table: dict[str, Any]) -> MeasureConfig:
        d = MeasureConfig()
        return MeasureConfig(
            warmup=self.integer(table.get("warmup", d.warmup), "measure.warmup"),
            number=self.integer(table.get("number", d.number), "measure.number", low=1),
            repeat=self.integer(table.get("repeat", d.repeat), "measure.repeat", low=1),
            min_repeat_ms=self.number(
                table.get("min_repeat_ms", d.min_repeat_ms), "measure.min_repeat_ms"
            ),
            flush_cache=self.boolean(
                table.get("flush_cache", d.flush_cache), "measure.flush_cache"
            ),
            max_cv=self.positive(table.get("max_cv", d.max_cv), "measure.max_cv"),
            max_iqr=self.positive(table.get("max_iqr", d.max_iqr), "measure.max_iqr"),
            retries=self.integer(table.get("retries", d.retries), "measure.retries"),
        )

    def positive(self, value: object, key: str) -> float:
        number = self.number(value, key)
        if number == 0:
            self.fail(key, f"must be > 0, got {value}")
        return number

    def workload(self, table: dict[str, Any]) -> tuple[str, dict[str, int], OnnxSource | None, Graph]:
        if "onnx" in table:
            return self.onnx_workload(table)
        for key in ("dims", "input_shapes", "inputs"):
            if key in table:
                self.fail(f"workload.{key}", 'only with onnx = "<model.onnx>"')
        if "name" not in table:
            self.fail("workload.name", 'missing: the name of a built-in workload, or onnx = "<model.onnx>"')
        name = self.choice(table["name"], "workload.name", tuple(WORKLOADS), "workload")
        spec = WORKLOADS[name]
        given = table.get("sizes", {})
        if not isinstance(given, dict):
            self.fail("workload.sizes", f"expected a table, got {_kind(given)}")
        for key, value in given.items():
            where = f"workload.sizes.{_key(key)}"
            if key not in spec.sizes:
                self.fail(where, f"unknown size of {name} (valid sizes: {', '.join(spec.sizes)})")
            self.integer(value, where, low=1)
        sizes = {**spec.sizes, **given}
        try:  # building the graph checks that the sizes fit together (hidden % heads, ...)
            graph = graph_shapes(spec, sizes)
        except (UserError, ValueError) as e:
            self.fail("workload.sizes", str(e))
        return name, sizes, None, graph

    def train(self, table: dict[str, Any], graph: Graph) -> TrainSpec | None:
        """``train = true`` with ``loss``, ``loss_output``, ``optimizer``, ``lr``: the step, or None.

        ``graph`` is the model's (its outputs are what ``loss_output`` may name).
        """
        train = self.boolean(table.get("train", False), "workload.train")
        if not train:
            for key in _TRAIN_KEYS[1:]:
                if key in table:
                    self.fail(f"workload.{key}", "an option of a training step: add train = true")
            return None
        given: dict[str, Any] = {}
        if "loss" in table:
            given["loss"] = self.choice(table["loss"], "workload.loss", LOSSES, "loss")
        if "optimizer" in table:
            given["optimizer"] = self.choice(table["optimizer"], "workload.optimizer", OPTIMIZERS, "optimizer")
        if "lr" in table:
            given["lr"] = self.positive(table["lr"], "workload.lr")
        if "loss_output" in table:
            outputs = tuple(graph.outputs)
            given["output"] = self.choice(table["loss_output"], "workload.loss_output", outputs, "output")
        spec = TrainSpec(**given)
        try:
            out = graph.values[loss_output(graph, spec)]
        except ValueError as e:
            self.fail("workload.loss_output", str(e))
        if spec.loss == "cross_entropy" and (not out.shape or out.shape[-1] < 2):
            self.fail("workload.loss", f"cross_entropy needs classes on the last axis of {out.name!r}, shape {out.shape}")
        return spec

    def onnx_workload(self, table: dict[str, Any]) -> tuple[str, dict[str, int], OnnxSource, Graph]:
        """``onnx = "model.onnx"`` (relative to the space file), ``[workload.dims]``, ``[workload.input_shapes]``,
        ``inputs = "arrays.npz"`` (relative to the space file: the arrays the model runs on)."""
        for key in ("name", "sizes"):
            if key in table:
                self.fail(f"workload.{key}", "not used with onnx: the model's file stem names the workload")
        path = table["onnx"]
        if not isinstance(path, str) or not path:
            self.fail("workload.onnx", f"expected the path of a .onnx file, got {_kind(path)}")
        base = Path(self.path).parent if not self.path.startswith("<") else Path.cwd()
        file = (base / path).resolve()
        if not file.is_file():
            self.fail("workload.onnx", f"no such file: {file}")
        dims = table.get("dims", {})
        if not isinstance(dims, dict):
            self.fail("workload.dims", f"expected a table of name = size, got {_kind(dims)}")
        for key, value in dims.items():
            self.integer(value, f"workload.dims.{_key(key)}", low=1)
        shapes = table.get("input_shapes", {})
        if not isinstance(shapes, dict):
            self.fail("workload.input_shapes", f"expected a table of input = [sizes], got {_kind(shapes)}")
        for key, value in shapes.items():
            where = f"workload.input_shapes.{_key(key)}"
            if not isinstance(value, list):
                self.fail(where, f"expected a list of sizes, got {_kind(value)}")
            for v in value:
                self.integer(v, where, low=1)
        inputs = table.get("inputs")
        if inputs is not None:
            if not isinstance(inputs, str) or not inputs:
                self.fail("workload.inputs", f"expected the path of a .npz file, got {_kind(inputs)}")
            inputs = (base / inputs).resolve()
        source = OnnxSource.make(file, dims, shapes, inputs)
        try:  # importing checks the model, its ops, that every dynamic dimension is fixed, the arrays
            arrays = source.arrays()
            imported = source.load(arrays)
            if source.inputs is not None:
                file_inputs(imported.graph, arrays, source.inputs)
        except InputFileError as e:
            self.fail("workload.inputs", str(e))
        except UserError as e:
            self.fail("workload.onnx", str(e))
        return source.name, dict(imported.dims), source, imported.graph

    def passes(self, table: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, bool]]:
        fixed_table = table.get("fixed", {})
        if not isinstance(fixed_table, dict):
            self.fail(
                "passes.fixed", f'expected a table of pass = "on" / "off", got {_kind(fixed_table)}'
            )
        fixed: dict[str, bool] = {}
        for name, value in fixed_table.items():
            key = f"passes.fixed.{_key(name)}"
            info = self.pass_info(name, key)
            if value not in ON_OFF:
                got = repr(value) if isinstance(value, str) else _kind(value)
                self.fail(key, f'expected "on" or "off", got {got}')
            if value == "off" and not info.switchable:
                self.fail(
                    key,
                    f"{info.name} cannot be off: it is needed for correctness (switchable = false)",
                )
            if info.name in fixed:
                self.fail(key, f"{info.name} is fixed twice (by its name and an alias)")
            fixed[info.name] = value == "on"
        search = table.get("search", "ALL")
        if isinstance(search, str):
            if search != "ALL":
                self.fail(
                    "passes.search", f'expected "ALL" or an array of pass names, got {search!r}'
                )
            return tuple(p.name for p in PASSES if p.switchable and p.name not in fixed), fixed
        if not isinstance(search, list):
            self.fail(
                "passes.search", f'expected "ALL" or an array of pass names, got {_kind(search)}'
            )
        names: set[str] = set()
        for i, name in enumerate(search):
            key = _key("passes", "search", i)
            info = self.pass_info(name, key)
            if not info.switchable:
                self.fail(
                    key,
                    f"{info.name} cannot be searched: it is needed for correctness (switchable = false) and always runs",
                )
            if info.name in names:
                self.fail(key, f"{info.name} is listed twice")
            if info.name in fixed:
                self.fail(
                    key,
                    f"{info.name} is also in passes.fixed: a pass is searched or fixed, not both",
                )
            names.add(info.name)
        return tuple(p.name for p in PASSES if p.name in names), fixed

    def split_points(
        self, table: object, searched: tuple[str, ...], fixed: Mapping[str, bool]
    ) -> dict[str, tuple[int, ...]]:
        if not isinstance(table, dict):
            self.fail("split_points", f"expected a table, got {_kind(table)}")
        # "Pass.point" = values, or (unquoted dotted keys) Pass = { point = values }
        entries: list[tuple[str, str, object, str]] = []
        for name, value in table.items():
            if "." in name:
                pass_name, point = name.split(".", 1)
                entries.append((pass_name, point, value, _key("split_points", name)))
            elif isinstance(value, dict) and not {"low", "high", "step"} & set(value):
                for point, v in value.items():
                    entries.append((name, point, v, _key("split_points", name, point)))
            else:
                self.fail(
                    _key("split_points", name),
                    'expected a "Pass.point" key, e.g. "MatMulRowSplitFusionPass.row_block"',
                )
        given: dict[str, tuple[int, ...]] = {}
        for pass_name, point, value, key in entries:
            info = self.pass_info(pass_name, key)
            sp = next((s for s in info.split_points if s.name == point), None)
            if sp is None:
                known = ", ".join(s.name for s in info.split_points)
                self.fail(
                    key,
                    f"{info.name} has no split point {point!r}"
                    + (f" (known: {known})" if known else ""),
                )
            full = f"{info.name}.{sp.name}"
            if full in given:
                self.fail(key, f"{full} is given twice (by its name and an alias)")
            if info.name not in searched and not fixed.get(info.name, info.default):
                self.fail(
                    key, f"{info.name} is off in this space, so its split point has no effect"
                )
            given[full] = self.split_values(value, sp, key)
        splits: dict[str, tuple[int, ...]] = {}
        for p in PASSES:
            may_cut = p.name in searched or fixed.get(p.name, False)
            for sp in p.split_points:
                full = f"{p.name}.{sp.name}"
                splits[full] = given.get(full) or (
                    _with_zero(sp.choices or (0,)) if may_cut else (0,)
                )
        return splits

    def split_values(self, value: object, sp: SplitPoint, key: str) -> tuple[int, ...]:
        values: list[int] = []
        if isinstance(value, int) and not isinstance(value, bool):
            values = [value]
        elif isinstance(value, list):
            if not value:
                self.fail(key, "expected at least one value")
            for v in value:
                if not isinstance(v, int) or isinstance(v, bool):
                    self.fail(key, f"expected integers, got {v!r} ({_kind(v)})")
                if v in values:
                    self.fail(key, f"{v} is listed twice")
                values.append(v)
        elif isinstance(value, dict):
            self.known(value, ("low", "high", "step"), key)
            for bound in ("low", "high"):
                if bound not in value:
                    self.fail(
                        f"{key}.{bound}",
                        "missing: a range needs low and high (step is optional, 1 by default)",
                    )
            low = self.integer(value["low"], f"{key}.low")
            high = self.integer(value["high"], f"{key}.high")
            step = self.integer(value.get("step", 1), f"{key}.step", low=1)
            if low > high:
                self.fail(key, f"low ({low}) is greater than high ({high})")
            values = list(range(low, high + 1, step))
        else:
            self.fail(
                key,
                f"expected an array of integers, a {{ low, high, step }} range or an integer, got {_kind(value)}",
            )
        for v in values:
            if not sp.low <= v <= sp.high:
                self.fail(key, f"{v} is outside [{sp.low}, {sp.high}]")
        out = _with_zero(values) if len(values) > 1 else tuple(values)
        if len(out) > MAX_SPLIT_VALUES:
            self.fail(
                key,
                f"{len(out)} values, at most {MAX_SPLIT_VALUES} can be searched: use a larger step",
            )
        return out


def _with_zero(values: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The values sorted, with 0 (no cut) added: the baselines use it, and it is always meaningful."""
    return tuple(sorted({0, *values}))
