# make demo: installs, builds the bundled tiny corpus with tfds, trains on the CPU, prints CER.
# make test: installs .[test] and runs pytest.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-fast venv clean

$(VENV)/.stamp-base: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

# The tests cover LM beam search too (the lm extra: flashlight-text).
$(VENV)/.stamp-test: setup.py $(VENV)/.stamp-base
	$(PY) -m pip install -q -e '.[test,lm]'
	touch $@

venv: $(VENV)/.stamp-base

demo: $(VENV)/.stamp-base
	$(PY) -m ds2_jax.demo

test: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Everything but the learning tests marked slow.
test-fast: $(VENV)/.stamp-test
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .demo
