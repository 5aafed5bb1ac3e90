# fusiontune: every target creates .venv (and installs the package into it) when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
WORKLOAD ?= transformer_block

SPACE ?= search_spaces/transformer_block.toml
## Extra options of `make tune`, e.g. TUNE_ARGS="--trials 4" (tests/readme/run_readme.py uses it).
TUNE_ARGS ?=

.PHONY: setup tune bisect run test test-fast test-zoo bench peers lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,plots,postgres]'
	touch $(STAMP)

setup: $(STAMP)

## The main job: an optuna sweep over the fusion passes on local Ray workers, ending with the
## ranked table and the recommended fusion_switch.cfg under results/<study>/.
tune: $(STAMP)
	$(BIN)/fusiontune tune $(SPACE) --workers 2 $(TUNE_ARGS)

## Find the pass, then the fusion, that breaks transformer_block's accuracy bound.
bisect: $(STAMP)
	$(BIN)/fusiontune bisect $(SPACE)

## Fuse, compile and measure one workload with the default passes, against all-off.
run: $(STAMP)
	$(BIN)/fusiontune run $(WORKLOAD) --vs-all-off

## Every test tier but bench and zoo (fast, slow, ray, db): what CI runs. In two runs: first the
## tests that only compute (numerics against the interpreter, the ONNX walks; most of their time is
## numba compiling kernels) on two pytest workers sharing the kernel cache (a test file to a
## worker, an idle one taking the other's pending tests); then, one test at a time, the rest, which
## time programs, start Ray clusters, PostgreSQL servers and competing processes, and must have
## the machine to themselves. With the first run go what checks results and exit codes but never
## a time: the sampler's planted sweeps and the report's planted effects (arithmetic on simulated
## runtimes), the report from hand-made trials, racing on a job that prints its runtime, bisect
## and a training sweep in process, and the README's commands in a fresh clone (7 minutes, listed
## first so that a worker starts them at once). The two workers are the first run's parallelism:
## each builds its cold kernels in its own process (FUSIONTUNE_COMPILE_JOBS=1), not in a compile
## process per core beside the other worker's.
COMPUTE_TESTS := tests/readme/test_readme.py \
                 tests/onnx tests/codegen tests/ir tests/passes tests/workloads tests/config tests/test_properties.py \
                 tests/tune/test_fusion_sampler.py tests/report/test_effects.py tests/report/test_report.py \
                 tests/tune/test_racing.py tests/test_cli_bisect.py tests/test_cli_train.py \
                 tests/benchmarks/test_bench_samplers_smoke.py
test: $(STAMP)
	FUSIONTUNE_COMPILE_JOBS=1 $(BIN)/python -m pytest -m "not bench and not zoo" -n 2 --dist worksteal --durations=10 $(COMPUTE_TESTS)
	$(BIN)/python -m pytest -m "not bench and not zoo" --durations=20 $(addprefix --ignore=,$(COMPUTE_TESTS))

## The heaviest ONNX zoo models of the backend walk (minutes each from a cold kernel cache).
test-zoo: $(STAMP)
	$(BIN)/python -m pytest -m zoo -s tests/onnx

## The fast tier only (the default of a plain `pytest`).
test-fast: $(STAMP)
	$(BIN)/python -m pytest

## Benchmarks: print figures, never gate anything.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_samplers.py
	$(BIN)/python benchmarks/bench_approx.py
	$(BIN)/python benchmarks/bench_conv.py
	$(BIN)/python benchmarks/bench_attention.py

## fusiontune beside onnxruntime, JAX jit, torch.compile, numpy and numexpr (benchmarks/RESULTS.md).
## torch is the CPU wheel of 2.13.0 (a plain `torch` from PyPI pulls the CUDA build); a peer that
## does not install is skipped with a note.
peers: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[peers]'
	$(BIN)/python -m pip install -q torch==2.13.0 || echo "peers: torch 2.13.0 did not install: torch.compile is skipped"
	$(BIN)/python benchmarks/peers.py --sweep 8

lint: $(STAMP)
	$(BIN)/python -m pip install -q ruff mypy
	$(BIN)/ruff check fusiontune tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .fusiontune_cache
