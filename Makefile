# ftplane: `make demo` runs the main job on embedded defaults, `make test` runs every test.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
NVRX_PIN ?= nvidia-resiliency-ext==0.4.1

.PHONY: demo test lint serve clean system-deps

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q "$(NVRX_PIN)" -e ".[server,trainer,dev]"
	@touch $(STAMP)

system-deps:
	@bash .ci/system-deps

demo: $(STAMP)
	$(BIN)/python -m ftplane.demo

# Tests that share nothing run side by side: most of the suite's time is end-to-end jobs and servers
# waiting, so more workers than cores pay (tests/support/ports.py and tests/conftest.py isolate them).
TEST_WORKERS ?= 4

test: $(STAMP) system-deps lint
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist worksteal --durations=25

lint: $(STAMP)
	$(BIN)/ruff check api workers trainer ftplane tests bench
	$(BIN)/ruff format --check api workers trainer ftplane tests bench
	$(BIN)/mypy api workers ftplane bench

serve: $(STAMP)
	$(BIN)/ftplane serve

clean:
	rm -rf $(VENV) .ftplane
