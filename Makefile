# make demo: installs, builds the bundled tiny corpus with tfds, trains on the CPU, prints CER.
# make test: installs .[test] and runs pytest.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-gpu mutate venv clean

$(VENV)/.stamp-base: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# The tests cover LM beam search too: the lm extra, then pyctcdecode without its numpy<2
# pin (it runs on numpy 2; jax needs numpy >= 2). See BUILD_NOTES "Decoding".
$(VENV)/.stamp-test: setup.py $(VENV)/.stamp-base
	$(PY) -m pip install -q -e '.[test,lm]'
	$(PY) -m pip install -q --no-deps pyctcdecode==0.5.0
	touch $@

venv: $(VENV)/.stamp-base

demo: $(VENV)/.stamp-base
	$(PY) -m ds2_jax.demo

test: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Everything but the learning tests marked slow.
test-fast: $(VENV)/.stamp-test
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The kernel numerics (marker gpu) on a GPU, float32 matmuls at full precision. GPU_PYTHON:
# a python whose jax has CUDA (e.g. pip install -U "jax[cuda12]"), pytest and torch. The files
# are named so that collection imports neither tfds nor ml_collections.
GPU_PYTHON ?= $(PY)
GPU_TESTS := tests/test_recurrence.py tests/test_ctc.py tests/test_space_to_depth.py tests/test_batch_axis.py
test-gpu:
	JAX_PLATFORMS=cuda JAX_DEFAULT_MATMUL_PRECISION=highest $(GPU_PYTHON) -m pytest -q -m gpu $(GPU_TESTS) $(PYTEST_ARGS)

# Mutation testing (tests/mutate.py): each listed wrong change must fail its tests.
mutate: $(VENV)/.stamp-test
	$(PY) tests/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) .demo
