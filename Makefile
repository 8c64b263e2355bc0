# Two entry points, each self-contained on a machine with only python3 and pip:
#   make demo   build a demo upstream from the fixture kernels, then scan, resolve and print the matrix
#   make test   run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The resolver and mirror need no torch: the demo runs without it.
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Tests also compare our variant choice with kernels' own for this host, which needs torch.
$(VENV)/.torch: $(VENV)/.base
	$(BIN)/pip install -q torch==2.13.0 numpy
	touch $@

demo: $(VENV)/.base
	$(BIN)/python -m tests.demo

test: $(VENV)/.torch
	$(BIN)/python -m pytest -q

bench: $(VENV)/.torch
	$(BIN)/python -m bench.resolve

clean:
	rm -rf $(VENV) demo-home
