"""FusionConfig: a search point. Which passes are on, and the value of every split point.

A FusionConfig is always *resolved*: it holds a switch for every registered pass and a value for
every split point, so two configs compare and hash by what they do. Partial descriptions (a
fusion_switch.cfg, a graph_kernel_flags string) resolve against the registry exactly as CANN does:
defaults, then ``ALL``, then explicit entries; non-switchable passes stay on.

A configuration of a user's own job (a command target, ``[target] kind = "command"``) resolves the
same way against the job's own pass table instead of the registry: :class:`JobPass` rows (a CANN
or MindSpore pass name, its kind, whether it may be switched off) that the search space lists.
Such a configuration carries its table (``FusionConfig.passes``), has no split points, and writes
``"pass_table": "job"`` into its JSON so that it reads back against the same table.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fusiontune.errors import UserError
from fusiontune.passes.base import KINDS
from fusiontune.passes.registry import BY_NAME, PASSES


class ConfigError(UserError, ValueError):
    """A configuration that cannot be resolved; the message names the source and the key."""


JOB_TABLE = "job"
"""The value of ``"pass_table"`` in the JSON of a configuration over a job's own passes."""


@dataclass(frozen=True)
class JobPass:
    """A fusion pass of the user's own job (a command target): known by its name only.

    The job (ATC, GE, a MindSpore script) owns the pass; fusiontune only switches it. Every job
    pass is on by default, as CANN's built-in rules are.

    Attributes:
        name: the name the job reads (``SoftmaxFusionPass``, ``add_layer_norm_fusion``).
        kind: ``GraphFusion`` or ``UBFusion``: the section of ``fusion_switch.cfg`` it goes in.
        switchable: False for a pass the job cannot run without: it stays on.
    """

    name: str
    kind: str
    switchable: bool = True

    @property
    def default(self) -> bool:
        return True


def job_table(passes: Iterable[JobPass]) -> tuple[JobPass, ...]:
    """The passes as a table: GraphFusion ones first, each kind in the order given; checked for
    kinds and duplicates.

    Raises:
        ValueError: an unknown kind or a name given twice.
    """
    table = tuple(passes)
    seen: set[str] = set()
    for p in table:
        if p.kind not in KINDS:
            raise ValueError(f"job pass {p.name}: kind must be GraphFusion or UBFusion, got {p.kind!r}")
        if p.name in seen:
            raise ValueError(f"job pass {p.name} is listed twice")
        seen.add(p.name)
    return tuple(sorted(table, key=lambda p: KINDS.index(p.kind)))


@dataclass(frozen=True)
class FusionConfig:
    """Resolved switches (pass name -> on) and split points (``"Pass.point"`` -> int).

    ``passes`` is None for a configuration of fusiontune's own registry, and a job's pass table
    for a configuration of a command target (see the module docstring).
    """

    switches: Mapping[str, bool]
    split_points: Mapping[str, int]
    passes: tuple[JobPass, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "switches", MappingProxyType(dict(sorted(self.switches.items()))))
        object.__setattr__(self, "split_points", MappingProxyType(dict(sorted(self.split_points.items()))))
        if self.passes is not None:  # by kind, as the sections of fusion_switch.cfg list them
            table = sorted(self.passes, key=lambda p: KINDS.index(p.kind) if p.kind in KINDS else 2)
            object.__setattr__(self, "passes", tuple(table))

    def __hash__(self) -> int:
        return hash(self.key())

    def __reduce__(self) -> tuple[object, ...]:
        # MappingProxyType does not pickle; Ray ships configs to workers.
        return (FusionConfig, (dict(self.switches), dict(self.split_points), self.passes))

    # ---- construction --------------------------------------------------------------------
    @staticmethod
    def defaults(passes: Sequence[JobPass] | None = None) -> FusionConfig:
        """The registry defaults, split points at 0 (no cut); with ``passes``, every job pass on."""
        return FusionConfig.resolve(passes=passes)

    @staticmethod
    def all_off(passes: Sequence[JobPass] | None = None) -> FusionConfig:
        """Everything switchable off: every op its own kernel (the non-switchable passes still run).

        With ``passes``: every switchable pass of the job off.
        """
        return FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False}, passes=passes)

    @staticmethod
    def resolve(
        all_switch: Mapping[str, bool] | None = None,
        explicit: Mapping[str, bool] | None = None,
        split_points: Mapping[str, int] | None = None,
        source: str = "<config>",
        passes: Sequence[JobPass] | None = None,
    ) -> FusionConfig:
        """Resolve CANN's way: registry defaults, then ``ALL`` per kind, then explicit entries.

        Args:
            all_switch: kind (GraphFusion / UBFusion) -> the ``"ALL"`` value, when given.
            explicit: pass name -> on/off for named passes.
            split_points: ``"Pass.point"`` -> value; unnamed points are 0.
            source: the file or flag string this came from, for error messages.
            passes: a job's pass table: resolve against it instead of the registry (every job
                pass on by default; a job configuration has no split points).

        Raises:
            ConfigError: an unknown pass or split point, an explicit off of a non-switchable
                pass, or a split value out of range.
        """
        from fusiontune.passes.registry import closest

        if passes is not None:
            return _resolve_job(tuple(passes), all_switch, explicit, split_points, source)
        def unknown(name: str) -> str:
            return f"unknown pass {name!r} (closest known: {', '.join(closest(name)) or 'none'})"

        switches = _resolve_switches(
            PASSES, all_switch, explicit, source, unknown,
            "it is needed for correctness (switchable=false); \"ALL\":\"off\" leaves it on",
            lambda name: BY_NAME.get(name),
        )
        points = {f"{p.name}.{sp.name}": 0 for p in PASSES for sp in p.split_points}
        for key, value in (split_points or {}).items():
            if key not in points:
                hint = ", ".join(sorted(points)) or "none"
                raise ConfigError(f"{source}: unknown split point {key!r} (known: {hint})")
            pass_name, point = key.split(".", 1)
            sp = next(s for s in BY_NAME[pass_name].split_points if s.name == point)
            if not isinstance(value, int) or isinstance(value, bool) or not sp.low <= value <= sp.high:
                raise ConfigError(f"{source}: split point {key} must be an integer in [{sp.low}, {sp.high}], got {value!r}")
            points[key] = value
        return FusionConfig(switches, points)

    # ---- queries -------------------------------------------------------------------------
    @property
    def is_job(self) -> bool:
        """True for a configuration over a job's own passes (a command target)."""
        return self.passes is not None

    def pass_rows(self) -> Sequence[Any]:
        """The table this configuration resolves against: the job's passes, or the registry's.

        Every row has ``name``, ``kind``, ``default`` and ``switchable``.
        """
        if self.passes is not None:
            return self.passes
        return PASSES

    def enabled(self, pass_name: str) -> bool:
        return self.switches[pass_name]

    def split_value(self, pass_name: str, point: str) -> int:
        return self.split_points[f"{pass_name}.{point}"]

    def with_values(
        self, switches: Mapping[str, bool], split_points: Mapping[str, int] | None = None
    ) -> FusionConfig:
        """A configuration over the same table with these switches and split points."""
        return FusionConfig.resolve(
            explicit=dict(switches),
            split_points=dict(self.split_points if split_points is None else split_points),
            passes=self.passes,
        )

    def with_switches(self, **changes: bool) -> FusionConfig:
        """A copy with some switches changed (non-switchable passes are refused)."""
        return self.with_values({**self.switches, **changes})

    def with_splits(self, **changes: int) -> FusionConfig:
        return self.with_values(self.switches, {**self.split_points, **changes})

    def diff(self, other: FusionConfig) -> list[str]:
        """Pass names whose switch differs between the two configs."""
        return [k for k in self.switches if self.switches[k] != other.switches.get(k)]

    def key(self) -> str:
        """A short stable hash of what this config does."""
        blob = json.dumps({"s": dict(self.switches), "p": dict(self.split_points)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, object]:
        """``best_config.json``: switches grouped by kind, and split points.

        A job configuration adds ``"pass_table": "job"`` and ``"not_switchable": [...]``: its
        sections then list the job's passes in table order, which is the table itself.
        """
        out: dict[str, object] = {kind: {} for kind in KINDS}
        for p in self.pass_rows():
            out[p.kind][p.name] = "on" if self.switches[p.name] else "off"  # type: ignore[index]
        out["split_points"] = dict(self.split_points)
        if self.passes is not None:
            out["pass_table"] = JOB_TABLE
            out["not_switchable"] = [p.name for p in self.passes if not p.switchable]
        return out

    @staticmethod
    def from_json(data: Mapping[str, object], source: str = "<json>") -> FusionConfig:
        """Read what :meth:`to_json` wrote (``best_config.json``), registry or job configuration.

        Raises:
            ConfigError: a section that is not an object, a value other than "on" / "off", an
                unknown pass, or a bad split point.
        """
        if data.get("pass_table") == JOB_TABLE:
            return _job_from_json(data, source)
        explicit = {name: on for _kind, name, on in _json_switches(data, source)}
        points = data.get("split_points", {})
        if not isinstance(points, Mapping):
            raise ConfigError(f"{source}: split_points must be an object")
        return FusionConfig.resolve(explicit=explicit, split_points=dict(points), source=source)


# ---- resolution ----------------------------------------------------------------------------------
def _resolve_switches(
    table: Sequence[Any],
    all_switch: Mapping[str, bool] | None,
    explicit: Mapping[str, bool] | None,
    source: str,
    unknown: Callable[[str], str],
    why_on: str,
    find: Callable[[str], Any],
) -> dict[str, bool]:
    """CANN's order over a table of passes (rows with name, kind, default, switchable): the
    defaults, then ``ALL`` per kind, then the explicit entries; non-switchable passes stay on."""
    switches = {p.name: bool(p.default) for p in table}
    for kind, on in (all_switch or {}).items():
        if kind not in KINDS:
            raise ConfigError(f"{source}: unknown section {kind!r} (expected GraphFusion or UBFusion)")
        for p in table:
            if p.kind == kind and p.switchable:
                switches[p.name] = on
    for name, on in (explicit or {}).items():
        info = find(name)
        if info is None:
            raise ConfigError(f"{source}: {unknown(name)}")
        if not info.switchable and not on:
            raise ConfigError(f"{source}: {name} cannot be switched off: {why_on}")
        switches[name] = bool(on)
    return switches


# ---- job configurations ------------------------------------------------------------------------
def _resolve_job(
    table: tuple[JobPass, ...],
    all_switch: Mapping[str, bool] | None,
    explicit: Mapping[str, bool] | None,
    split_points: Mapping[str, int] | None,
    source: str,
) -> FusionConfig:
    """:meth:`FusionConfig.resolve` against a job's pass table."""
    by_name = {p.name: p for p in table}

    def unknown(name: str) -> str:
        hint = ", ".join(difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.5)) or "none"
        return f"{name!r} is not a pass of the job's table (closest: {hint})"

    switches = _resolve_switches(
        table, all_switch, explicit, source, unknown, "the job lists it as not switchable", by_name.get
    )
    if any(split_points.values() if split_points else ()):
        raise ConfigError(f"{source}: a job configuration has no split points, got {dict(split_points or {})}")
    return FusionConfig(switches, {}, table)


def _json_switches(data: Mapping[str, object], source: str) -> list[tuple[str, str, bool]]:
    """``(kind, name, on)`` for every entry of the GraphFusion / UBFusion objects of a best_config.json."""
    out = []
    for kind in KINDS:
        section = data.get(kind, {})
        if not isinstance(section, Mapping):
            raise ConfigError(f"{source}: {kind} must be an object")
        for name, value in section.items():
            if value not in ("on", "off"):
                raise ConfigError(f"{source}: {kind}.{name} must be \"on\" or \"off\", got {value!r}")
            out.append((kind, str(name), value == "on"))
    return out


def _job_from_json(data: Mapping[str, object], source: str) -> FusionConfig:
    fixed = data.get("not_switchable", [])
    if not isinstance(fixed, list) or not all(isinstance(n, str) for n in fixed):
        raise ConfigError(f"{source}: not_switchable must be a list of pass names")
    switches = _json_switches(data, source)
    rows = [JobPass(name, kind, name not in fixed) for kind, name, _on in switches]
    explicit = {name: on for _kind, name, on in switches}
    try:
        table = job_table(rows)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    points = data.get("split_points") or {}
    if not isinstance(points, Mapping):
        raise ConfigError(f"{source}: split_points must be an object")
    return FusionConfig.resolve(
        explicit=explicit, split_points=dict(points), source=source, passes=table
    )
