"""Planted stand-in jobs for the sampler benchmark: a known runtime model, a known optimum.

A stand-in job answers every configuration from a formula instead of a measurement, so a sampler
can be scored against the exact optimum (found by enumerating every point). The formula is
log-linear in the switches, the way fusion gains compose (each kernel saved is a fraction of the
runtime)::

    runtime(x, s) = T0 * exp(-g(x, s)) * noise
    g(x, s) = sum_i a_i x_i                       additive gain of switch i (x_i = 1: on)
            + sum_(i,j) b_ij x_i x_j              pairwise interactions (two fusions that compete
            + sum_(i,j,k) c_ijk x_i x_j x_k         for the same ops, or one that enables another)
            + sum_p x_p d_p[s_p]                  split point p of a switched pass: the gain of
                                                  its value s_p (d_p[0] = 0), only when p is on
    noise ~ lognormal(0, sigma), sigma 1-5%, drawn from (job, run seed, trial): a configuration
          measured twice in one study is answered from its first measurement by the loop anyway.

    error(x) = bound * (0.2 + 0.6 * share of switches on)       below the bound, always
             + 5 * bound if an accuracy culprit is on            a switch, or a pair both on

Every culprit is on by default, and tempting (a large additive gain): the registry defaults are
infeasible, as in the issue's example. Coefficients are drawn from ``numpy.random.default_rng``
seeded with the job's ``seed`` (see :func:`planted_job`), so a job is the same everywhere.

A job without split points is a command-target space over its own pass names (the command is
never run: :class:`PlantedEvaluator` answers). Split points exist on the built-in target only,
so a job with split points searches registry passes (their real names and split points); the
benchmark then hashes a configuration by its key, as the loop does for a command target (a
stand-in job has no program).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fusiontune.measure.accuracy import ErrorMetrics
from fusiontune.tune.records import EvalRequest, EvalResult, EvalStatus
from fusiontune.workloads.space import PASS_PARAM, SPLIT_PARAM, SearchSpace, loads_space

T0_S = 1e-3  # the all-off runtime: 1 ms
BOUND = 1e-3
CULPRIT_ERROR = 5.0  # an accuracy culprit's error, in bounds
_CHUNK = 1 << 18  # enumeration chunk (points): 2**18 x 24 float64 bits = 50 MB

# Pass names of CANN's fusion_switch.cfg (GraphFusion and UBFusion rules), for the command jobs.
CANN_PASSES = (
    "ConvBatchnormFusionPass", "SoftmaxFusionPass", "MatMulBiasAddFusionPass",
    "ConvToFullyConnectionFusionPass", "PoolingFusionPass", "ConvConcatFusionPass",
    "ZConcatExt2FusionPass", "TfMergeSubFusionPass", "TbeEltwiseFusionPass",
    "TbeMultiOutputFusionPass", "BatchMatmulFusionPass", "TransdataCastFusionPass",
    "SquareSumV1FusionPass", "LayerNormFusionPass", "ConvAddFusionPass", "ReduceMeanFusionPass",
)  # fmt: skip
# Exact, switchable registry passes (no "only:" attribution trials), split-point passes first.
REGISTRY_SPLIT = {
    "NormSplitFusionPass": ("stats", (0, 1)),
    "MatMulRowSplitFusionPass": ("row_block", (0, 32, 128, 512)),
    "TbeEltwiseSplitFusionPass": ("cut", (0, 2, 4)),
    "FlashAttentionFusionPass": ("kv_block", (0, 64, 128)),
}
REGISTRY_PASSES = (
    "MatMulBiasAddFusionPass", "ConvBatchnormFusionPass", "ConvBiasAddFusionPass",
    "GeluFusionPass", "SoftmaxFusionPass", "LayerNormFusionPass", "RmsNormFusionPass",
    "AddLayerNormFusionPass", "AddRmsNormFusionPass", "SwiGluFusionPass", "GeGluFusionPass",
    "RotaryPositionEmbeddingFusionPass", "SplitConcatFusionPass", "MatmulElemBiasaddFusionPass",
    "MatmulElemReluFusionPass", "MatmulElemGeluFusionPass", "MatmulElemAddFusionPass",
    "TbeConvElemwiseFusionPass", "TbeEltwiseFusionPass", "CompositeOpsFusionPass",
    "TbeMultiOutputFusionPass",
)  # fmt: skip


@dataclass(frozen=True)
class PlantedJob:
    """A stand-in job: switches, split points, planted coefficients, and its exact optimum.

    Attributes:
        name: the job's name (also its study name).
        structure: what is planted, in words (``additive + 2 pairwise``).
        switches: the pass names searched, in order (bit i of a point is switch i).
        splits: per split point, ``(pass index, "Pass.point", values)``; values start with 0.
        additive: a_i, per switch.
        pairwise: ``((i, j), b_ij)`` terms.
        threeway: ``((i, j, k), c_ijk)`` terms.
        split_gain: per split point, d_p[v] for each of its values (d_p[0] = 0).
        culprits: accuracy culprits: ``(i,)`` or ``(i, j)`` (both on).
        noise: sigma of the lognormal measurement noise (0.01 is 1%).
        optimum_s: the noise-free runtime of the best feasible point, by enumeration.
        optimum: that point, as trial params.
        points: the number of points in the space.
    """

    name: str
    structure: str
    switches: tuple[str, ...]
    splits: tuple[tuple[int, str, tuple[int, ...]], ...]
    additive: tuple[float, ...]
    pairwise: tuple[tuple[tuple[int, int], float], ...]
    threeway: tuple[tuple[tuple[int, int, int], float], ...]
    split_gain: tuple[tuple[float, ...], ...]
    culprits: tuple[tuple[int, ...], ...]
    noise: float
    optimum_s: float = math.nan
    optimum: Mapping[str, object] = field(default_factory=dict)
    points: int = 0

    @property
    def is_command(self) -> bool:
        """A command-target job (its own pass names, no split points)."""
        return not self.splits

    def culprit_names(self) -> list[str]:
        return ["+".join(self.switches[i] for i in c) for c in self.culprits]

    # ---- the model --------------------------------------------------------------------------
    def point(self, params: Mapping[str, object]) -> tuple[np.ndarray, tuple[int, ...]]:
        """Switch bits and split values of a trial's params (``pass.X`` on/off, ``split.P.p``)."""
        bits = np.array([params[PASS_PARAM + s] == "on" for s in self.switches], dtype=np.float64)
        values = tuple(int(params[SPLIT_PARAM + key]) for _, key, _ in self.splits)  # type: ignore[call-overload]
        return bits, values

    def gain(self, bits: np.ndarray, values: Sequence[int]) -> np.ndarray:
        """g(x, s) for a batch of points ``bits`` (n x switches) sharing split values."""
        x = np.atleast_2d(bits)
        g = x @ np.asarray(self.additive)
        for (i, j), b in self.pairwise:
            g += b * x[:, i] * x[:, j]
        for (i, j, k), c in self.threeway:
            g += c * x[:, i] * x[:, j] * x[:, k]
        for (p, _, vals), gains, v in zip(self.splits, self.split_gain, values, strict=True):
            g += x[:, p] * gains[vals.index(v)]
        return g

    def feasible(self, bits: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(bits)
        ok = np.ones(len(x), dtype=bool)
        for c in self.culprits:
            ok &= ~np.all(x[:, list(c)] > 0.5, axis=1)
        return ok

    def true_runtime(self, params: Mapping[str, object]) -> float:
        """The noise-free runtime of a trial's params, seconds."""
        bits, values = self.point(params)
        return float(T0_S * math.exp(-self.gain(bits, values)[0]))

    def error(self, bits: np.ndarray) -> float:
        err = BOUND * (0.2 + 0.6 * float(bits.mean()))
        return err + (0.0 if self.feasible(bits)[0] else CULPRIT_ERROR * BOUND)

    # ---- the space --------------------------------------------------------------------------
    def space_toml(self) -> str:
        """The search space a ``fusiontune tune`` of this job would read."""
        names = ", ".join(f'"{s}"' for s in self.switches)
        search = '\n[search]\nsampler = "tpe"\nseed = 0\nworkers = 0\n'
        if self.is_command:
            return (
                f'name = "{self.name}"\n\n[target]\nkind = "command"\n'
                '# never run: the planted evaluator answers\ncommand = ["{python}", "-c", "pass"]\n\n'
                f"[passes]\nGraphFusion = [{names}]\n\n[accuracy]\nbound = {BOUND}\n" + search
            )
        splits = "\n".join(f'"{key}" = {list(vals)}' for _, key, vals in self.splits)
        return (
            f'name = "{self.name}"\n\n[workload]\nname = "mlp"\nsizes = {{ batch = 4, hidden = 16 }}\n\n'
            f"[passes]\nsearch = [{names}]\n\n[split_points]\n{splits}\n\n"
            f'[accuracy]\nmetric = "max_rel"\nbound = {BOUND}\n' + search
        )

    def space(self) -> SearchSpace:
        return loads_space(self.space_toml(), f"<planted:{self.name}>")


def enumerate_optimum(job: PlantedJob) -> PlantedJob:
    """``job`` with its exact optimum: every point evaluated (numpy, in chunks of 2**18)."""
    n = len(job.switches)
    shifts = np.arange(n, dtype=np.int64)
    best_g, best = -math.inf, None
    split_values = [vals for _, _, vals in job.splits]
    for values in itertools.product(*split_values):
        for start in range(0, 1 << n, _CHUNK):
            idx = np.arange(start, min(start + _CHUNK, 1 << n), dtype=np.int64)
            bits = ((idx[:, None] >> shifts) & 1).astype(np.float64)
            g = np.where(job.feasible(bits), job.gain(bits, values), -np.inf)
            k = int(np.argmax(g))
            if g[k] > best_g:
                best_g, best = float(g[k]), (int(idx[k]), values)
    assert best is not None
    code, values = best
    optimum: dict[str, object] = {
        PASS_PARAM + s: "on" if code >> i & 1 else "off" for i, s in enumerate(job.switches)
    }
    for (_, key, _), v in zip(job.splits, values, strict=True):
        optimum[SPLIT_PARAM + key] = v
    points = (1 << n) * math.prod(len(v) for v in split_values)
    return _replace(job, optimum_s=T0_S * math.exp(-best_g), optimum=optimum, points=points)


def _replace(job: PlantedJob, **changes: object) -> PlantedJob:
    import dataclasses

    return dataclasses.replace(job, **changes)  # type: ignore[arg-type]


# ---- the family -----------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSpec:
    """How to draw one planted job (:func:`planted_job`)."""

    name: str
    switches: int
    pairwise: int = 0
    threeway: int = 0
    culprits: tuple[int, ...] = (1,)  # per culprit, how many switches it takes (1, or 2: a pair)
    noise: float = 0.02
    splits: int = 0
    seed: int = 0


SPECS = (
    # The issue's own job: 12 switches, additive gains plus two pairwise terms, one culprit.
    JobSpec("issue12", 12, pairwise=2, culprits=(1,), noise=0.02, seed=12),
    JobSpec("add8", 8, culprits=(1,), noise=0.01, seed=8),
    JobSpec("pair12", 12, pairwise=4, culprits=(1, 2), noise=0.03, seed=112),
    JobSpec("split10", 10, pairwise=2, culprits=(1,), noise=0.02, splits=2, seed=1012),
    JobSpec("three16", 16, pairwise=3, threeway=2, culprits=(1,), noise=0.02, seed=16),
    JobSpec("noisy16", 16, pairwise=3, culprits=(1,), noise=0.05, seed=116),
    JobSpec(
        "split13", 13, pairwise=2, threeway=1, culprits=(1, 1), noise=0.03, splits=3, seed=1316
    ),
    JobSpec("add20", 20, pairwise=2, culprits=(1,), noise=0.02, seed=20),
    JobSpec("three24", 24, pairwise=4, threeway=2, culprits=(1, 1), noise=0.03, seed=24),
    JobSpec("pair24", 24, pairwise=5, culprits=(2,), noise=0.01, seed=124),
)
QUICK_JOBS = ("issue12", "add8", "split10")


def planted_job(spec: JobSpec) -> PlantedJob:
    """Draw a job's coefficients from ``default_rng(spec.seed)`` and find its optimum.

    Additive gains: 70% of switches help (+0.5% to +6%), the rest hurt (-0.5% to -4%). Pairwise
    and three-way terms join distinct random switches with a gain or a loss of 2-8%. A culprit
    switch gets a gain of 8-12% (it is the one a search wants); a culprit pair is two switches
    that each help and together break accuracy. A split point's nonzero values gain -3% to +5%.
    """
    rng = np.random.default_rng(spec.seed)
    n = spec.switches
    if spec.splits:
        split_passes = list(REGISTRY_SPLIT)[: spec.splits]
        others = list(rng.choice(REGISTRY_PASSES, n - spec.splits, replace=False))
        switches = tuple(split_passes + sorted(others, key=REGISTRY_PASSES.index))
    elif n <= len(CANN_PASSES):
        switches = tuple(CANN_PASSES[:n])
    else:
        switches = tuple(f"Pass{chr(ord('A') + i)}" for i in range(n))
    helps = rng.random(n) < 0.7
    additive = np.where(helps, rng.uniform(0.005, 0.06, n), -rng.uniform(0.005, 0.04, n))
    order = list(rng.permutation(n))
    culprits: list[tuple[int, ...]] = []
    for size in spec.culprits:
        members = tuple(sorted(int(order.pop()) for _ in range(size)))
        culprits.append(members)
        for i in members:
            additive[i] = rng.uniform(0.08, 0.12) if size == 1 else rng.uniform(0.02, 0.06)

    def term(k: int) -> tuple[tuple[int, ...], float]:
        idx = tuple(sorted(int(i) for i in rng.choice(n, k, replace=False)))
        sign = 1.0 if rng.random() < 0.5 else -1.0
        return idx, float(sign * rng.uniform(0.02, 0.08))

    pairwise = tuple(term(2) for _ in range(spec.pairwise))
    threeway = tuple(term(3) for _ in range(spec.threeway))
    splits, split_gain = [], []
    for p, name in enumerate(switches[: spec.splits]):
        point, values = REGISTRY_SPLIT[name]
        splits.append((p, f"{name}.{point}", values))
        split_gain.append((0.0, *(float(g) for g in rng.uniform(-0.03, 0.05, len(values) - 1))))
    parts = ["additive"]
    if spec.pairwise:
        parts.append(f"{spec.pairwise} pairwise")
    if spec.threeway:
        parts.append(f"{spec.threeway} three-way")
    if spec.splits:
        parts.append(f"{spec.splits} split points")
    job = PlantedJob(
        name=spec.name,
        structure=" + ".join(parts),
        switches=switches,
        splits=tuple(splits),
        additive=tuple(float(a) for a in additive),
        pairwise=pairwise,  # type: ignore[arg-type]
        threeway=threeway,  # type: ignore[arg-type]
        split_gain=tuple(split_gain),
        culprits=tuple(culprits),
        noise=spec.noise,
    )
    return enumerate_optimum(job)


def planted_jobs(names: Sequence[str] | None = None) -> list[PlantedJob]:
    """The family (or the named jobs), optima found; unknown names raise ``KeyError``."""
    by_name = {s.name: s for s in SPECS}
    return [planted_job(by_name[n]) for n in (names or list(by_name))]


# ---- the evaluator --------------------------------------------------------------------------
class PlantedEvaluator:
    """Answers from a planted job's formula (the Evaluator protocol); noise from (seed, trial).

    Args:
        job: the planted job.
        seed: the run's seed (the sampler's), so two runs of one sampler differ in noise too.
    """

    workers = 1

    def __init__(self, job: PlantedJob, seed: int) -> None:
        self.job = job
        self.seed = seed
        self._job_id = zlib.crc32(job.name.encode())

    def evaluate(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        return [self._one(r) for r in requests]

    def _one(self, request: EvalRequest) -> EvalResult:
        switches = request.config.switches
        bits = np.array([switches[s] for s in self.job.switches], dtype=np.float64)
        values = tuple(request.config.split_points.get(key, 0) for _, key, _ in self.job.splits)
        true_s = T0_S * math.exp(-float(self.job.gain(bits, values)[0]))
        which = request.trial if request.trial >= 0 else 10**6 + zlib.crc32(request.label.encode())
        rng = np.random.default_rng((self._job_id, self.seed, which))
        median = true_s * math.exp(self.job.noise * float(rng.standard_normal()))
        err = self.job.error(bits)
        key = request.config.key()
        return EvalResult(
            request.trial,
            key,
            key,
            EvalStatus.OK,
            median_s=median,
            iqr_s=0.0,
            cv=self.job.noise,
            min_s=median,
            samples_s=(median,),
            attempts=1,
            errors=None if self.job.is_command else ErrorMetrics(err, err, err, err, True),
            reported={"runtime_s": median, "error": err} if self.job.is_command else {},
            kernels=int(len(bits) - bits.sum()) + 1,
        )

    def close(self) -> None:
        return None
