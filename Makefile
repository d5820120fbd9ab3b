# make demo: installs, builds the bundled tiny corpus with tfds, trains on the CPU, prints CER
#            and draws the run's curves to .demo/run/curves.png.
# make plot: redraws the curves of WORKDIR (default .demo/run) from its metrics.jsonl.
# make test: installs .[test] and runs pytest (TEST_WORKERS=2 processes; 0 = one).
# make lint: ruff check and ruff format --check over the tree (.ci/run runs it before the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test runs pytest in this many worker processes (pytest-xdist; 0 = in this process).
# The tests of the trained demo model share one worker (conftest.py).
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
WORKDIR ?= .demo/run
export WORKDIR  # the recipe quotes it from the environment: any path a shell accepts
# glibc's malloc asks Linux for transparent huge pages: XLA:CPU's large buffers, freed and taken anew
# every step, then fault in 2 MB at a time instead of 4 kB. The demo model's training: 24.6 M page faults
# -> 0.5 M, 82 -> 67 s (benchmarks/results/2026-12-06-cpu-hugepages/). Ignored where glibc lacks it.
# The tests get it from tests/conftest.py.
HUGE_PAGES := GLIBC_TUNABLES=$(if $(GLIBC_TUNABLES),$(GLIBC_TUNABLES):)glibc.malloc.hugetlb=1

.PHONY: demo plot test test-fast lint test-gpu converge-gpu mutate venv clean

$(VENV)/.stamp-base: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[plot]'
	touch $@

# The tests cover LM beam search too (the lm extra: flashlight-text).
$(VENV)/.stamp-test: setup.py $(VENV)/.stamp-base
	$(PY) -m pip install -q -e '.[test,lm]'
	touch $@

venv: $(VENV)/.stamp-base

demo: $(VENV)/.stamp-base
	$(HUGE_PAGES) $(PY) -m ds2_jax.demo

plot: $(VENV)/.stamp-base
	$(PY) -m ds2_jax.plot --workdir="$$WORKDIR"

test: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# ruff over the whole tree: lint, and the format checked (`ruff format .` applies it); pyproject.toml.
lint: $(VENV)/.stamp-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Everything but the learning tests marked slow.
test-fast: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The kernel numerics (marker gpu) on a GPU, float32 matmuls at full precision, and a whole
# bfloat16 step against float32 on the bundled corpus. GPU_PYTHON: a python whose jax has CUDA
# (e.g. pip install -U "jax[cuda12]"), pytest, torch and the package's requirements
# (test_bf16_step.py reads the corpus through tfds and the seed config through ml_collections).
GPU_PYTHON ?= $(PY)
GPU_TESTS := tests/test_recurrence.py tests/test_ctc.py tests/test_space_to_depth.py tests/test_batch_axis.py \
	tests/test_bf16_step.py
test-gpu:
	JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest $(GPU_PYTHON) -m pytest -q -m gpu $(GPU_TESTS) $(PYTEST_ARGS)

# The convergence check every kernel or precision change answers to (one GPU): the seed model on
# the bundled corpus, its cosine decay fitted to the 600 steps, float32 scan_vjp (the reference),
# bfloat16 scan_vjp and bfloat16 'auto', seeds 0-9, deterministic ops; the table and the goal in
# $(CONVERGE_OUT)/NOTES.md. CONVERGE_PROCESSES seeds train at once, sharing the GPU: about 6 min on
# one H200 (one after another: 30 min).
CONVERGE_OUT ?= .converge
CONVERGE_SEEDS ?= 0,1,2,3,4,5,6,7,8,9
CONVERGE_PROCESSES ?= 5
# Rows per device (16: the seed's; 32 and 64 run the wide Mosaic calls).
CONVERGE_BATCH ?= 16
converge-gpu:
	$(GPU_PYTHON) -m benchmarks.precision --out=$(CONVERGE_OUT) --seeds=$(CONVERGE_SEEDS) --processes=$(CONVERGE_PROCESSES) \
		--runs=float32:scan_vjp,bfloat16:scan_vjp,bfloat16:auto --steps=600 --evals=3 --config.deterministic=True \
		--config.per_device_batch_size=$(CONVERGE_BATCH)

# Mutation testing (tests/mutate.py): each listed wrong change must fail its tests.
mutate: $(VENV)/.stamp-test
	$(PY) tests/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) .demo
