"""Search spaces: the shipped files load, bad input is one line naming file and key, params round-trip."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution

from fusiontune.config.fusion_config import FusionConfig
from fusiontune.errors import UserError
from fusiontune.measure import MeasureConfig
from fusiontune.passes.registry import PASSES, switchable_passes
from fusiontune.workloads import WORKLOADS
from fusiontune.workloads.space import (
    SearchSpace,
    SpaceError,
    baseline_params,
    config_from_params,
    dimension_choices,
    distributions,
    grid_size,
    load_space,
    loads_space,
    param_names,
    params_from_config,
    parse_duration,
)

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
# The spaces of the built-in workloads and of the ONNX models under search_spaces/models/; the
# *_template.toml files tune a command target.
SHIPPED = sorted(p for p in SPACES_DIR.glob("*.toml") if not p.stem.endswith("_template"))
MODELS = sorted((SPACES_DIR / "models").glob("*.onnx"))
TEMPLATES = sorted(SPACES_DIR.glob("*_template.toml"))
SWITCHABLE = [p.name for p in switchable_passes()]
ALL_SPLITS = [f"{p.name}.{sp.name}" for p in PASSES for sp in p.split_points]

MINIMAL = '[workload]\nname = "mlp"\n'


def space_of(text: str) -> SearchSpace:
    return loads_space(text, "x.toml")


def error_of(text: str, path: str = "search_spaces/x.toml") -> str:
    with pytest.raises(SpaceError) as info:
        loads_space(text, path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


# ---- the shipped files -----------------------------------------------------------------------------
TRAIN_SUFFIX = "_train"

def test_one_shipped_space_per_builtin_workload_and_per_model() -> None:
    assert len(MODELS) == 3
    inference = [p.stem for p in SHIPPED if not p.stem.endswith(TRAIN_SUFFIX)]
    assert sorted(inference) == sorted([*WORKLOADS, *(m.stem for m in MODELS)])
    # Training spaces are named after what they train: <workload or model>_train.
    trained = [p.stem.removesuffix(TRAIN_SUFFIX) for p in SHIPPED if p.stem.endswith(TRAIN_SUFFIX)]
    assert "transformer_block" in trained and set(trained) <= set(inference)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_space_loads_and_is_small_enough_for_minutes(path: Path) -> None:
    space = load_space(path)
    model = path.stem.removesuffix(TRAIN_SUFFIX)
    assert (space.train is not None) == path.stem.endswith(TRAIN_SUFFIX)
    assert space.workload == model and space.name == path.stem
    if space.onnx is None:
        assert dict(space.sizes) == dict(WORKLOADS[space.workload].sizes)
    else:
        assert Path(space.onnx.path) == SPACES_DIR / "models" / f"{model}.onnx"
    assert space.trials <= 50 and space.workers == 2
    assert space.measure.repeat <= 7 and space.measure.min_repeat_ms <= 10
    assert space.metric == "max_rel" and 0 < space.bound <= 1e-3
    assert all(0 in values for values in space.splits.values())
    # Every split point a space searches exists; each space searches at least one.
    assert space.splits and set(space.splits) <= set(ALL_SPLITS)
    if space.sampler == "grid":
        assert grid_size(space) + 2 <= space.trials  # the baselines are not grid points


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_space_baselines_are_the_registry_defaults_and_all_off(path: Path) -> None:
    space = load_space(path)
    base = baseline_params(space)
    defaults = config_from_params(space, base["defaults"])
    all_off = config_from_params(space, base["all_off"])
    if space.searched == tuple(SWITCHABLE) and not space.fixed:
        assert defaults == FusionConfig.defaults()
        assert all_off == FusionConfig.all_off()
    else:  # the searched passes follow the baseline; the others keep their fixed or default value
        for name in space.searched:
            assert defaults.switches[name] == FusionConfig.defaults().switches[name]
            assert not all_off.switches[name]
        for name, on in space.fixed.items():
            assert defaults.switches[name] == all_off.switches[name] == on
    assert set(defaults.split_points.values()) == set(all_off.split_points.values()) == {0}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_shipped_command_templates_load_and_run_in_process(path: Path) -> None:
    space = load_space(path)
    assert len(TEMPLATES) == 2 and space.target is not None
    assert space.workload == "" and not space.splits and space.metric == "error"
    assert space.trials == 40 and space.workers == 0 and space.sampler == "fusion"
    assert (Path(space.target.base_dir) / space.target.command[1]).is_file()  # the bundled job
    assert 8 <= len(space.searched) <= 12  # a 40-trial TPE sweep finds the optimum
    base = baseline_params(space)
    assert config_from_params(space, base["defaults"]) == FusionConfig.defaults(space.passes)
    assert config_from_params(space, base["all_off"]) == FusionConfig.all_off(space.passes)
    assert pickle.loads(pickle.dumps(space)) == space


def test_all_spaces_search_every_switchable_pass() -> None:
    space = space_of(MINIMAL)
    assert space.searched == tuple(SWITCHABLE)
    assert "ConstantFoldingPass" not in space.searched
    assert space.name == "x"
    assert space.measure == MeasureConfig() and space.sampler == "fusion" and space.timeout_s is None


# ---- parameters ------------------------------------------------------------------------------------
def test_distributions_name_every_dimension_with_storage_names() -> None:
    space = load_space(SPACES_DIR / "transformer_block.toml")
    dists = distributions(space)
    assert list(dists) == param_names(space)
    assert all(isinstance(d, CategoricalDistribution) for d in dists.values())
    choices = {
        name: d.choices for name, d in dists.items() if isinstance(d, CategoricalDistribution)
    }
    assert choices["pass.SoftmaxFusionPass"] == ("off", "on")
    assert choices["split.MatMulRowSplitFusionPass.row_block"] == (0, 16, 32, 64)
    assert choices["split.TbeEltwiseSplitFusionPass.cut"] == (0, 2, 4, 8)  # registry choices
    assert choices["split.FlashAttentionFusionPass.kv_block"] == (0, 32, 64, 128)  # registry choices
    assert grid_size(space) == 2 ** len(SWITCHABLE) * 4 * 2 * 4 * 4  # conv split points pinned to 0


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_params_round_trip_through_config(path: Path) -> None:
    space = load_space(path)
    rng = random.Random(0)
    choices = dimension_choices(space)
    for _ in range(20):
        params = {name: rng.choice(values) for name, values in choices.items()}
        config = config_from_params(space, params)
        assert params_from_config(space, config) == params
        assert config_from_params(space, params_from_config(space, config)) == config


def test_config_from_params_keeps_fixed_passes_and_defaults() -> None:
    space = space_of(
        MINIMAL
        + '[passes]\nsearch = ["GeluFusionPass"]\nfixed = { MatmulElemReluFusionPass = "off" }\n'
        + '[split_points]\n"MatMulRowSplitFusionPass.row_block" = 64\n'
    )
    assert param_names(space) == ["pass.GeluFusionPass"]
    config = config_from_params(space, {"pass.GeluFusionPass": "off"})
    assert not config.switches["GeluFusionPass"]
    assert not config.switches["MatmulElemReluFusionPass"]
    assert config.switches["SoftmaxFusionPass"]  # neither searched nor fixed: registry default
    assert config.split_points["MatMulRowSplitFusionPass.row_block"] == 64
    assert config.split_points["TbeEltwiseSplitFusionPass.cut"] == 0


def test_config_from_params_rejects_params_of_another_space() -> None:
    space = space_of(MINIMAL + '[passes]\nsearch = ["GeluFusionPass"]\n')
    with pytest.raises(SpaceError, match="'pass.SoftmaxFusionPass' is not a dimension"):
        config_from_params(space, {"pass.GeluFusionPass": "on", "pass.SoftmaxFusionPass": "on"})
    with pytest.raises(SpaceError, match="missing pass.GeluFusionPass"):
        config_from_params(space, {})
    with pytest.raises(SpaceError, match="is not one of"):
        config_from_params(space, {"pass.GeluFusionPass": True})


def test_space_pickles() -> None:
    space = load_space(SPACES_DIR / "llama_block.toml")
    assert pickle.loads(pickle.dumps(space)) == space


# ---- split points ----------------------------------------------------------------------------------
def test_split_point_forms_list_range_single_and_alias() -> None:
    space = space_of(
        MINIMAL
        + "[split_points]\n"
        + '"MatMulRowSplitFusionPass.row_block" = [128, 32]\n'
        + '"elemwise_split_fusion.cut" = { low = 2, high = 8, step = 3 }\n'
        + '"NormSplitFusionPass.stats" = 1\n'
    )
    assert space.splits["MatMulRowSplitFusionPass.row_block"] == (0, 32, 128)  # 0 added, sorted
    assert space.splits["TbeEltwiseSplitFusionPass.cut"] == (0, 2, 5, 8)
    assert space.splits["NormSplitFusionPass.stats"] == (1,)
    assert "split.NormSplitFusionPass.stats" not in param_names(space)


def test_unquoted_dotted_split_key_is_read_the_same() -> None:
    space = space_of(MINIMAL + "[split_points]\nMatMulRowSplitFusionPass.row_block = [0, 32]\n")
    assert space.splits["MatMulRowSplitFusionPass.row_block"] == (0, 32)


def test_split_points_of_unsearched_passes_are_fixed_at_zero() -> None:
    space = space_of(MINIMAL + '[passes]\nsearch = ["GeluFusionPass"]\n')
    assert all(values == (0,) for values in space.splits.values())


def test_split_points_of_passes_fixed_on_are_searched() -> None:
    space = space_of(
        MINIMAL + '[passes]\nsearch = ["GeluFusionPass"]\nfixed = { NormSplitFusionPass = "on" }\n'
    )
    assert space.splits["NormSplitFusionPass.stats"] == (0, 1)


# ---- durations -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("8h", 28800.0),
        ("10m", 600.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("90", 90.0),
        (45, 45.0),
        ("2d", 172800.0),
        (" 10 m ", 600.0),
    ],
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["8x", "", "h", "-5m", "0", 0, "10m x", "inf", True])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(UserError, match="--timeout: invalid duration"):
        parse_duration(text, "--timeout")  # type: ignore[arg-type]


def test_durations_in_the_file() -> None:
    space = space_of(MINIMAL + '[search]\ntimeout = "8h"\ntrial_timeout = 90\n')
    assert space.timeout_s == 28800.0 and space.trial_timeout_s == 90.0


# ---- one-line errors naming file and key -----------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # malformed TOML, with tomllib's line and column
        (
            '[workload\nname = "mlp"\n',
            "invalid TOML: Expected ']' at the end of a table declaration (at line 1, column 10)",
        ),
        ('[workload]\nname = "mlp\n', "invalid TOML: "),
        # the workload
        ("[passes]\n", "workload: missing"),
        (
            '[workload]\nname = "transformer"\n',
            "workload.name: unknown workload 'transformer' (closest: transformer_block",
        ),
        ("[workload]\nsizes = { batch = 2 }\n", "workload.name: missing"),
        (MINIMAL + "sizes = { batch = 0 }\n", "workload.sizes.batch: must be >= 1, got 0"),
        (
            MINIMAL + "sizes = { seq = 8 }\n",
            "workload.sizes.seq: unknown size of mlp (valid sizes: batch, hidden)",
        ),
        (
            '[workload]\nname = "transformer_block"\nsizes = { hidden = 130 }\n',
            "workload.sizes: hidden (130) must be a multiple of heads (4)",
        ),
        # an ONNX model replaces name / sizes (tests/workloads/test_onnx_space.py covers the rest)
        (MINIMAL + "onnx = 'model.onnx'\n", "workload.name: not used with onnx"),
        (MINIMAL + "dims = {batch = 2}\n", 'workload.dims: only with onnx = "<model.onnx>"'),
        # passes
        (
            MINIMAL
            + '[passes]\nsearch = ["GeluFusionPass", "SoftmaxFusionPass", "SoftmaxFusion"]\n',
            "passes.search[2]: unknown pass 'SoftmaxFusion' (closest known: SoftmaxFusionPass",
        ),
        (
            MINIMAL + '[passes]\nsearch = ["ConstantFoldingPass"]\n',
            "passes.search[0]: ConstantFoldingPass cannot be searched: it is needed for correctness",
        ),
        (
            MINIMAL + '[passes]\nfixed = { IdentityEliminationPass = "off" }\n',
            "passes.fixed.IdentityEliminationPass: IdentityEliminationPass cannot be off",
        ),
        (
            MINIMAL + '[passes]\nfixed = { SoftmaxFusionPas = "off" }\n',
            "passes.fixed.SoftmaxFusionPas: unknown pass 'SoftmaxFusionPas' (closest known: SoftmaxFusionPass",
        ),
        (
            MINIMAL + "[passes]\nfixed = { SoftmaxFusionPass = false }\n",
            'passes.fixed.SoftmaxFusionPass: expected "on" or "off", got a boolean',
        ),
        (
            MINIMAL + '[passes]\nsearch = "all"\n',
            'passes.search: expected "ALL" or an array of pass names',
        ),
        (
            MINIMAL + '[passes]\nsearch = ["GeluFusionPass", "gelu_fusion"]\n',
            "passes.search[1]: GeluFusionPass is listed twice",
        ),
        (
            MINIMAL + '[passes]\nsearch = ["GeluFusionPass"]\nfixed = { GeluFusionPass = "on" }\n',
            "passes.search[0]: GeluFusionPass is also in passes.fixed",
        ),
        (MINIMAL + "[passes]\nsearch = []\n", "passes.search: the space has no search dimension"),
        # split points
        (
            MINIMAL + '[split_points]\n"MatMulRowSplitFusionPass.row_block" = [0, 5000]\n',
            'split_points."MatMulRowSplitFusionPass.row_block": 5000 is outside [0, 4096]',
        ),
        (
            MINIMAL + '[split_points]\n"TbeEltwiseSplitFusionPass.cut" = { low = 8, high = 2 }\n',
            'split_points."TbeEltwiseSplitFusionPass.cut": low (8) is greater than high (2)',
        ),
        (
            MINIMAL
            + '[split_points]\n"TbeEltwiseSplitFusionPass.cut" = { low = 0, high = 8, stride = 2 }\n',
            'split_points."TbeEltwiseSplitFusionPass.cut".stride: unknown key (known: low, high, step)',
        ),
        (
            MINIMAL
            + '[split_points]\n"TbeEltwiseSplitFusionPass.cut" = { low = 0, high = 8, step = 0 }\n',
            'split_points."TbeEltwiseSplitFusionPass.cut".step: must be >= 1, got 0',
        ),
        (
            MINIMAL
            + '[split_points]\n"MatMulRowSplitFusionPass.row_block" = { low = 0, high = 4096 }\n',
            'split_points."MatMulRowSplitFusionPass.row_block": 4097 values, at most 64',
        ),
        (
            MINIMAL + '[split_points]\n"MatMulRowSplitFusionPass.row_block" = [0, 32, 32]\n',
            'split_points."MatMulRowSplitFusionPass.row_block": 32 is listed twice',
        ),
        (
            MINIMAL + '[split_points]\n"MatMulRowSplitFusionPass.row_block" = [0, 32.0]\n',
            'split_points."MatMulRowSplitFusionPass.row_block": expected integers, got 32.0 (a float)',
        ),
        (
            MINIMAL + '[split_points]\n"MatMulRowSplitFusionPass.rows" = [0, 32]\n',
            "MatMulRowSplitFusionPass has no split point 'rows' (known: row_block)",
        ),
        (
            MINIMAL + '[split_points]\n"MatMulRowSplit.row_block" = [0, 32]\n',
            "split_points.\"MatMulRowSplit.row_block\": unknown pass 'MatMulRowSplit' (closest known: MatMulRowSplitFusionPass",
        ),
        (
            MINIMAL + "[split_points]\nrow_block = [0, 32]\n",
            'split_points.row_block: expected a "Pass.point" key',
        ),
        (
            MINIMAL
            + '[passes]\nfixed = { MatMulRowSplitFusionPass = "off" }\n[split_points]\n"MatMulRowSplitFusionPass.row_block" = [0, 32]\n',
            "MatMulRowSplitFusionPass is off in this space, so its split point has no effect",
        ),
        # accuracy, measure, search
        (
            MINIMAL + '[accuracy]\nmetric = "max_rell"\n',
            "accuracy.metric: unknown metric 'max_rell' (closest: max_rel",
        ),
        (
            MINIMAL + "[accuracy]\nbound = -1\n",
            "accuracy.bound: must be a finite number >= 0, got -1",
        ),
        (
            MINIMAL + '[accuracy]\nbound = "1e-3"\n',
            "accuracy.bound: expected a number, got a string",
        ),
        (
            MINIMAL + "[measure]\nrepet = 7\n",
            "measure.repet: unknown key (known: warmup, number, repeat, min_repeat_ms, flush_cache,",
        ),
        (MINIMAL + "[measure]\nrepeat = 0\n", "measure.repeat: must be >= 1, got 0"),
        (
            MINIMAL + "[measure]\nflush_cache = 1\n",
            "measure.flush_cache: expected true or false, got an integer",
        ),
        (MINIMAL + '[search]\nsampler = "cmaes"\n', "search.sampler: unknown sampler 'cmaes'"),
        (MINIMAL + "[search]\ntrials = 0\n", "search.trials: must be >= 1, got 0"),
        (MINIMAL + '[search]\ntimeout = "8x"\n', "search.timeout: invalid duration '8x'"),
        (
            MINIMAL + "[search]\ntrial_timeout = [1]\n",
            'search.trial_timeout: expected a duration like "10m" or seconds, got an array',
        ),
        (MINIMAL + '[search]\nsampler = "grid"\n', "search.sampler: grid needs a small space"),
        (MINIMAL + "[search]\nseed = -1\n", "search.seed: must be >= 0, got -1"),
        # the top level
        (
            MINIMAL + "[serach]\ntrials = 4\n",
            "serach: unknown key (known: name, workload, target, passes, split_points, accuracy, measure, search)",
        ),
        ('name = "my study"\n' + MINIMAL, "name: expected a study name"),
        (MINIMAL + "measure = 3\n", "workload.measure: unknown key"),
        ("measure = 3\n" + MINIMAL, "measure: expected a table, got an integer"),
    ],
)
def test_bad_space_is_one_line_naming_file_and_key(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match=r"nope\.toml: no such file$"):
        load_space(tmp_path / "nope.toml")


def test_space_error_is_a_user_error() -> None:
    assert issubclass(SpaceError, UserError)
