"""MindSpore ``graph_kernel_flags`` strings: ``--enable_pass=a,b --disable_pass=c``.

MindSpore switches fusion passes with ``set_context(graph_kernel_flags="--disable_pass=xxx")``
(``--enable_pass`` to switch one on). A pass may be named by its MindSpore alias
(``add_layer_norm_fusion``) or its CANN name; rendering uses the first alias. Other MindSpore
flags in the same string (``--opt_level=2``, ``--dump_as_text``) are not about fusion passes: they
are kept verbatim in :attr:`FlagsResult.ignored` so a caller can say it ignored them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from fusiontune.config.fusion_config import ConfigError, FusionConfig
from fusiontune.passes.base import PassInfo
from fusiontune.passes.registry import PASSES, closest, lookup

ENABLE = "--enable_pass"
DISABLE = "--disable_pass"


@dataclass(frozen=True)
class FlagsResult:
    """A parsed ``graph_kernel_flags`` string.

    Attributes:
        config: the registry defaults with the enables, then the disables, applied.
        enabled: CANN names of the passes named by ``--enable_pass``, in order.
        disabled: CANN names of the passes named by ``--disable_pass``, in order.
        ignored: the other MindSpore flags, verbatim (``--opt_level=2``).
    """

    config: FusionConfig
    enabled: tuple[str, ...]
    disabled: tuple[str, ...]
    ignored: tuple[str, ...]


def flag_name(info: PassInfo) -> str:
    """The name a pass goes by in graph_kernel_flags: its first MindSpore alias, else its name."""
    return info.aliases[0] if info.aliases else info.name


def _hint(name: str) -> str:
    found = [flag_name(info) for n in closest(name, n=6) if (info := lookup(n)) is not None]
    return ", ".join(list(dict.fromkeys(found))[:3]) or "none"


def _tokens(text: str, source: str) -> list[tuple[str, str | None]]:
    """Split into (flag, value) pairs; ``--flag=v`` and ``--flag v`` both give a value."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"{source}: cannot split into flags: {e}") from None
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or len(word) == 2:
            raise ConfigError(f"{source}: {word}: expected --flag or --flag=value")
        flag, eq, value = word.partition("=")
        i += 1
        if not eq and i < len(words) and not words[i].startswith("--"):
            value, eq = words[i], "="
            i += 1
        # "--disable_pass=a, b": shlex cut the list at the space after the comma.
        while eq and value.endswith(",") and i < len(words) and not words[i].startswith("--"):
            value += words[i]
            i += 1
        pairs.append((flag, value if eq else None))
    return pairs


def parse_graph_kernel_flags(text: str, source: str = "graph_kernel_flags") -> FlagsResult:
    """Parse a ``graph_kernel_flags`` string, keeping the unrelated flags apart.

    Args:
        text: e.g. ``"--enable_pass=a,b --disable_pass c --opt_level=2"``; flags may repeat.
        source: where the string came from, for error messages.

    Returns:
        The configuration (registry defaults, then enables, then disables; split points at 0),
        the passes named, and the ignored flags.

    Raises:
        ConfigError: an unknown pass (with the closest known names), a pass both enabled and
            disabled, a disabled non-switchable pass, an empty pass list, or a stray word.
    """
    named: dict[str, dict[str, str]] = {ENABLE: {}, DISABLE: {}}
    ignored: list[str] = []
    for flag, value in _tokens(text, source):
        if flag not in named:
            ignored.append(flag if value is None else f"{flag}={value}")
            continue
        names = [n.strip() for n in (value or "").split(",") if n.strip()]
        if not names:
            raise ConfigError(f"{source}: {flag}: expects a comma-separated list of pass names")
        for name in names:
            info = lookup(name)
            if info is None:
                raise ConfigError(
                    f"{source}: {flag}={name}: unknown pass (closest known: {_hint(name)})"
                )
            named[flag].setdefault(info.name, name)
    for cann, name in named[DISABLE].items():
        if cann in named[ENABLE]:
            raise ConfigError(
                f"{source}: {DISABLE}={name}: the pass is also given to {ENABLE}"
                f" (as {named[ENABLE][cann]})"
            )
        if not lookup(cann).switchable:  # type: ignore[union-attr]
            raise ConfigError(
                f"{source}: {DISABLE}={name}: {cann} cannot be switched off: it is needed for "
                "correctness"
            )
    # Resolve from a full switch map, so the result depends only on this module's view of the
    # registry defaults (the same view render_flags uses).
    switches = {p.name: p.default for p in PASSES}
    switches.update(dict.fromkeys(named[ENABLE], True))
    switches.update(dict.fromkeys(named[DISABLE], False))
    config = FusionConfig.resolve(explicit=switches, source=source)
    return FlagsResult(config, tuple(named[ENABLE]), tuple(named[DISABLE]), tuple(ignored))


def parse_flags(text: str, source: str = "graph_kernel_flags") -> FusionConfig:
    """Parse a ``graph_kernel_flags`` string into a configuration.

    Unrelated MindSpore flags are ignored; use :func:`parse_graph_kernel_flags` to see them.

    Args:
        text: e.g. ``"--enable_pass=a,b --disable_pass=c"``.
        source: where the string came from, for error messages.

    Returns:
        The registry defaults with the enables, then the disables, applied; split points at 0.

    Raises:
        ConfigError: see :func:`parse_graph_kernel_flags`.
    """
    return parse_graph_kernel_flags(text, source).config


def render_flags(config: FusionConfig) -> str:
    """Render the shortest ``graph_kernel_flags`` string that gives ``config``'s switches.

    Args:
        config: the configuration; split points cannot be expressed as flags and are dropped.

    Returns:
        ``--enable_pass=...`` for passes on that are off by default and ``--disable_pass=...`` for
        passes off that are on by default, named by their MindSpore alias, in registry order;
        ``""`` for the registry defaults. ``parse_flags(render_flags(c))`` has c's switches.

        A job configuration (a command target's) names every switchable pass of the job's table
        by the name the table gives it: ``--enable_pass=`` those on, ``--disable_pass=`` those
        off, whatever the job's own defaults are (an empty half is left out).
    """
    if config.is_job:
        rows = [p for p in config.pass_rows() if p.switchable]
        on = [p.name for p in rows if config.switches[p.name]]
        off = [p.name for p in rows if not config.switches[p.name]]
        return " ".join(
            f"{flag}={','.join(names)}" for flag, names in ((ENABLE, on), (DISABLE, off)) if names
        )
    enable = [flag_name(p) for p in PASSES if config.switches[p.name] and not p.default]
    disable = [flag_name(p) for p in PASSES if not config.switches[p.name] and p.default]
    parts = []
    if enable:
        parts.append(f"{ENABLE}={','.join(enable)}")
    if disable:
        parts.append(f"{DISABLE}={','.join(disable)}")
    return " ".join(parts)
