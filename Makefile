# thinking-seeds — install, test, demo.
# `make install` creates .venv; on machines without CUDA torch is pinned to the local CPU build
# in the same pip command (an unpinned torch pulls a multi-GB CUDA build).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
QUICK ?=

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_PIN)" -e ".[dev]"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: install
	$(BIN)/python -m demo $(if $(QUICK),--quick,)

bench: install
	$(BIN)/pip install --quiet "$(TORCH_PIN)" -e ".[bench]"
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) runs results .pytest_cache
