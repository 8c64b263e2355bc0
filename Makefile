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
	$(BIN)/pip install -q torch==2.13.0 numpy transformers
	touch $@

# The same protocol-facing tests under huggingface_hub 1.x (httpx) — 2.x (httpx2) is the main venv's.
VENV1 := .venv-hub1
HUB1_TESTS := tests/test_fakehub.py tests/test_scan_resolve.py tests/test_cli.py tests/test_packaging.py \
	tests/test_ledger.py tests/test_stage.py tests/test_stage_faults.py tests/test_serve.py
$(VENV1)/.base: pyproject.toml
	$(PY) -m venv $(VENV1)
	$(VENV1)/bin/python -m pip install -q --upgrade pip
	$(VENV1)/bin/pip install -q -e '.[test]' 'huggingface_hub==1.33.0' torch==2.13.0 numpy
	touch $@

demo: $(VENV)/.base
	$(BIN)/python -m tests.demo

test: $(VENV)/.torch $(VENV1)/.base
	$(BIN)/python -m pytest -q
	@echo "== the protocol-facing tests again, with huggingface_hub 1.33 =="
	$(VENV1)/bin/python -m pytest -q $(HUB1_TESTS)

bench: $(VENV)/.torch
	$(BIN)/python -m bench.resolve

clean:
	rm -rf $(VENV) $(VENV1) demo-home
