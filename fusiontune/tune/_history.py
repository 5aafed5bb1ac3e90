"""What a study's trials say, in the terms of ``--sampler fusion`` (rebuilt on every ask)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from optuna.trial import FrozenTrial, TrialState

from fusiontune.tune.store import TrialRecord

if TYPE_CHECKING:
    from fusiontune.tune.fusion_sampler import FusionSampler

MARGIN_CLIP = 3.0  # |log(error / bound)| beyond this says nothing more about feasibility


class History:
    """What the study's trials say, in the sampler's terms, rebuilt on every ask."""

    def __init__(self, sampler: FusionSampler, trials: Sequence[FrozenTrial]) -> None:
        self.s = sampler
        rows: list[tuple[np.ndarray, FrozenTrial, TrialRecord]] = []
        for t in trials:
            levels = sampler._levels(t.params)
            if levels is None:  # another space's trial, or not yet given its parameters
                continue
            rows.append((levels, t, TrialRecord.from_trial(t)))
        self.first = next((lv for lv, t, _ in rows if t.state == TrialState.COMPLETE), None)
        self.suspect, self.inert = self._inert(rows)
        held = [
            lv
            for lv, t, r in rows
            if not (t.state == TrialState.FAIL and (r.interrupted or r.result is None))
        ]
        self.held = self.codes(np.array(held)) if held else np.zeros(0, dtype=np.int64)
        self.held_raw = sampler.codes(np.array(held)) if held else np.zeros(0, dtype=np.int64)
        # trials the sampler proposed (not enqueued), measured or pending: the design's progress
        self.sampled = sum(
            1
            for _, t, r in rows
            if not r.role
            and not t.system_attrs.get("fixed_params")
            and not (t.state == TrialState.FAIL and (r.interrupted or r.result is None))
        )
        y, noise, levels_y, z, levels_z = [], [], [], [], []
        self.numbers: list[int] = []  # the trial of each runtime observation
        for lv, t, r in rows:
            margin = self._margin(t, r)
            if t.state == TrialState.COMPLETE and t.values:
                y.append(float(t.values[0]))
                self.numbers.append(t.number)
                noise.append(_spread(r))
                levels_y.append(lv)
            if margin is not None:
                z.append(margin)
                levels_z.append(lv)
        self.levels = np.array(levels_y).reshape(len(levels_y), len(sampler._sizes))
        y_arr = np.array(y, dtype=float)
        self.log = bool(len(y_arr)) and bool(np.all(y_arr > 0))
        self.y = np.log(y_arr) if self.log else y_arr
        self.noise = np.array(noise) if self.log else None
        self.X = sampler._features(self.levels)
        self.z = np.array(z, dtype=float)
        self.levels_z = np.array(levels_z).reshape(len(levels_z), len(sampler._sizes))
        self.Xz = sampler._features(self.levels_z)

    def own_var(self) -> np.ndarray:
        """Each runtime observation's own variance (log units): its spread squared, the mean of
        the known ones where a run has none; empty when no spread is known."""
        if self.noise is None:
            return np.zeros(0)
        own = np.asarray(self.noise, dtype=float) ** 2
        known = np.isfinite(own)
        return np.where(known, own, np.mean(own[known])) if known.any() else np.zeros(0)

    def _inert(
        self, rows: Sequence[tuple[np.ndarray, FrozenTrial, TrialRecord]]
    ) -> tuple[set[int], set[int]]:
        """Switches that generate no fusion: ``(suspect, inert)``.

        Suspect: it ran and matched nothing in every measured trial where it was on. The initial
        design leaves suspects out.

        Inert: a suspect that also matched nothing with each of its possible competitors off.
        A competitor is any switch that matched something in some measured trial: passes take
        ops from one another, so a pass that ran after them may match only where they are off
        (CompositeOps takes what the named fusions leave, and matches nothing at the defaults).
        Only inert passes are taken as "the same program on or off". Judged from the defaults
        alone, every pass that lost its ops to another would be declared inert, never be tried
        on again, and so stay inert.

        A pass with a searched split point may match only once cut, so it is a suspect only
        when it also matched nothing in a trial where one of its split points was cut.
        """
        s = self.s
        switches = np.flatnonzero(s.coding.switches)
        matched_somewhere = set()
        for lv, _, r in rows:
            if r.measured and r.result is not None:
                for k in switches:
                    name = s.coding.names[k][len("pass.") :]
                    if lv[k] != s._off[k] and r.result.matched(name) > 0:
                        matched_somewhere.add(int(k))
        suspect, inert = set(), set()
        for k in switches:
            pass_name = s.coding.names[k][len("pass.") :]
            splits = np.flatnonzero(s._owner == k)
            seen = False
            absent: set[int] = set()  # competitors seen off where this pass matched nothing
            for lv, _, r in rows:
                if lv[k] == s._off[k] or not r.measured or r.result is None:
                    continue
                fusion = r.result.fusion
                if pass_name not in fusion.passes_run:
                    continue
                if fusion.matched(pass_name) > 0:
                    break
                seen = seen or not len(splits) or bool(np.any(lv[splits] > 0))
                absent.update(int(j) for j in switches if lv[j] == s._off[j])
            else:
                if seen:
                    suspect.add(int(k))
                    if matched_somewhere - {int(k)} <= absent:
                        inert.add(int(k))
        return suspect, inert

    def observed_culprits(self) -> set[int]:
        """Switches seen to break the bound on their own: two observations that differ only in
        that switch, the one with it on infeasible and the other feasible (e.g. the defaults and
        the enqueued ``only:<Pass>`` trial), and no feasible observation with it on.

        The last condition keeps a pair of passes that break the bound only together (each
        helps alone) out: from the defaults, switching either off restores the bound, so each
        would look like a culprit, and the search would keep both off and lose both gains.
        Switching one off shows the other on and feasible.
        """
        s = self.s
        lv, z = self.canonical(self.levels_z), self.z
        feasible = z <= 0
        out = set()
        for a in np.flatnonzero(z > 0):
            diff = lv != lv[a]
            for b in np.flatnonzero(feasible & (diff.sum(axis=1) == 1)):
                k = int(np.flatnonzero(diff[b])[0])
                if s.coding.switches[k] and lv[a, k] != s._off[k]:
                    out.add(k)
        return {k for k in out if not np.any(feasible & (lv[:, k] != s._off[k]))}

    def _margin(self, t: FrozenTrial, r: TrialRecord) -> float | None:
        """``clip(log(error / bound))``; +clip for a failed evaluation; None when unknown."""
        if t.state == TrialState.FAIL:
            return None if (r.interrupted or r.result is None) else MARGIN_CLIP
        if t.state != TrialState.COMPLETE or r.constraint is None:
            return None
        bound = self.s.bound
        if bound is not None and bound > 0:
            error = max(r.constraint + bound, bound * math.exp(-MARGIN_CLIP))
            margin = math.log(error / bound)
        else:
            margin = r.constraint
        return float(np.clip(margin, -MARGIN_CLIP, MARGIN_CLIP))

    def _rows_of(self, levels: np.ndarray) -> np.ndarray:
        if not len(self.z):
            return np.zeros(0, dtype=bool)
        return np.all(self.levels_z == self.canonical(levels[None, :])[0], axis=1) | np.all(
            self.levels_z == levels, axis=1
        )

    def knows(self, levels: np.ndarray) -> bool:
        """Whether the feasibility of ``levels`` was observed."""
        return bool(self._rows_of(levels).any())

    def infeasible(self, levels: np.ndarray) -> bool:
        """Observed to break the bound (or fail)."""
        rows = self._rows_of(levels)
        return bool(rows.any()) and bool(np.all(self.z[rows] > 0))

    def canonical(self, levels: np.ndarray) -> np.ndarray:
        """The same programs' representative: inert passes off, splits of off passes uncut."""
        out = np.array(levels, copy=True)
        s = self.s
        for k in self.inert:
            out[:, k] = s._off[k]
        for k, owner in enumerate(s._owner):
            if owner >= 0:
                out[:, k] = np.where(out[:, owner] == s._off[owner], 0, out[:, k])
        return out

    def codes(self, levels: np.ndarray) -> np.ndarray:
        """The codes of the canonical forms of ``levels`` (rows)."""
        return self.s.codes(self.canonical(np.asarray(levels).reshape(-1, len(self.s._sizes))))

    def fresh(self, levels: np.ndarray) -> np.ndarray:
        """Which rows no trial holds (as the same program)."""
        codes = self.codes(levels)
        if codes.dtype == object:
            held = set(self.held.tolist())
            return np.array([c not in held for c in codes], dtype=bool)
        return ~np.isin(codes, self.held)


def _spread(r: TrialRecord) -> float:
    """The sd of a measured log runtime: from the 95% interval of its median, else its IQR or CV."""
    res = r.result
    if res is None or not res.ok or not res.median_s > 0:
        return math.nan
    if math.isfinite(res.ci_low_s) and math.isfinite(res.ci_high_s) and res.ci_low_s > 0:
        return (math.log(res.ci_high_s) - math.log(res.ci_low_s)) / (2 * 1.96)
    n = max(1, len(res.samples_s))
    # the sd of a median is about 1.25 sd / sqrt(n); a sample's sd from its IQR or its CV
    if math.isfinite(res.iqr_s) and res.iqr_s > 0:
        return 1.25 * res.iqr_s / res.median_s / 1.349 / math.sqrt(n)
    if math.isfinite(res.cv) and res.cv > 0:
        return 1.25 * res.cv / math.sqrt(n)
    return math.nan
