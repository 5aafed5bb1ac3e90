"""FusionConfig: a search point. Which passes are on, and the value of every split point.

A FusionConfig is always *resolved*: it holds a switch for every registered pass and a value for
every split point, so two configs compare and hash by what they do. Partial descriptions (a
fusion_switch.cfg, a graph_kernel_flags string) resolve against the registry exactly as CANN does:
defaults, then ``ALL``, then explicit entries; non-switchable passes stay on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fusiontune.errors import UserError
from fusiontune.passes.base import KINDS
from fusiontune.passes.registry import BY_NAME, PASSES


class ConfigError(UserError, ValueError):
    """A configuration that cannot be resolved; the message names the source and the key."""


@dataclass(frozen=True)
class FusionConfig:
    """Resolved switches (pass name -> on) and split points (``"Pass.point"`` -> int)."""

    switches: Mapping[str, bool]
    split_points: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "switches", MappingProxyType(dict(sorted(self.switches.items()))))
        object.__setattr__(self, "split_points", MappingProxyType(dict(sorted(self.split_points.items()))))

    def __hash__(self) -> int:
        return hash(self.key())

    def __reduce__(self) -> tuple[object, ...]:
        # MappingProxyType does not pickle; Ray ships configs to workers.
        return (FusionConfig, (dict(self.switches), dict(self.split_points)))

    # ---- construction --------------------------------------------------------------------
    @staticmethod
    def defaults() -> FusionConfig:
        """The registry defaults, split points at 0 (no cut)."""
        return FusionConfig.resolve()

    @staticmethod
    def all_off() -> FusionConfig:
        """Everything switchable off: every op its own kernel (the non-switchable passes still run)."""
        return FusionConfig.resolve(all_switch={"GraphFusion": False, "UBFusion": False})

    @staticmethod
    def resolve(
        all_switch: Mapping[str, bool] | None = None,
        explicit: Mapping[str, bool] | None = None,
        split_points: Mapping[str, int] | None = None,
        source: str = "<config>",
    ) -> FusionConfig:
        """Resolve CANN's way: registry defaults, then ``ALL`` per kind, then explicit entries.

        Args:
            all_switch: kind (GraphFusion / UBFusion) -> the ``"ALL"`` value, when given.
            explicit: pass name -> on/off for named passes.
            split_points: ``"Pass.point"`` -> value; unnamed points are 0.
            source: the file or flag string this came from, for error messages.

        Raises:
            ConfigError: an unknown pass or split point, an explicit off of a non-switchable
                pass, or a split value out of range.
        """
        from fusiontune.passes.registry import closest

        switches = {p.name: p.default for p in PASSES}
        for kind, on in (all_switch or {}).items():
            if kind not in KINDS:
                raise ConfigError(f"{source}: unknown section {kind!r} (expected GraphFusion or UBFusion)")
            for p in PASSES:
                if p.kind == kind and p.switchable:
                    switches[p.name] = on
        for name, on in (explicit or {}).items():
            info = BY_NAME.get(name)
            if info is None:
                hint = ", ".join(closest(name)) or "none"
                raise ConfigError(f"{source}: unknown pass {name!r} (closest known: {hint})")
            if not info.switchable and not on:
                raise ConfigError(
                    f"{source}: {name} cannot be switched off: it is needed for correctness"
                    f" (switchable=false); \"ALL\":\"off\" leaves it on"
                )
            switches[name] = on
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
    def enabled(self, pass_name: str) -> bool:
        return self.switches[pass_name]

    def split_value(self, pass_name: str, point: str) -> int:
        return self.split_points[f"{pass_name}.{point}"]

    def with_switches(self, **changes: bool) -> FusionConfig:
        """A copy with some switches changed (non-switchable passes are refused)."""
        return FusionConfig.resolve(explicit={**self.switches, **changes}, split_points=self.split_points)

    def with_splits(self, **changes: int) -> FusionConfig:
        return FusionConfig.resolve(explicit=dict(self.switches), split_points={**self.split_points, **changes})

    def diff(self, other: FusionConfig) -> list[str]:
        """Pass names whose switch differs between the two configs."""
        return [k for k in self.switches if self.switches[k] != other.switches.get(k)]

    def key(self) -> str:
        """A short stable hash of what this config does."""
        blob = json.dumps({"s": dict(self.switches), "p": dict(self.split_points)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, object]:
        """``best_config.json``: switches grouped by kind, and split points."""
        out: dict[str, object] = {kind: {} for kind in KINDS}
        for p in PASSES:
            out[p.kind][p.name] = "on" if self.switches[p.name] else "off"  # type: ignore[index]
        out["split_points"] = dict(self.split_points)
        return out

    @staticmethod
    def from_json(data: Mapping[str, object], source: str = "<json>") -> FusionConfig:
        explicit: dict[str, bool] = {}
        for kind in KINDS:
            section = data.get(kind, {})
            if not isinstance(section, Mapping):
                raise ConfigError(f"{source}: {kind} must be an object")
            for name, value in section.items():
                if value not in ("on", "off"):
                    raise ConfigError(f"{source}: {kind}.{name} must be \"on\" or \"off\", got {value!r}")
                explicit[name] = value == "on"
        points = data.get("split_points", {})
        if not isinstance(points, Mapping):
            raise ConfigError(f"{source}: split_points must be an object")
        return FusionConfig.resolve(explicit=explicit, split_points=dict(points), source=source)
