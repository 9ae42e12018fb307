# The quickstart is exactly two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-dev lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	# torch is optional; its tests skip with a reason when it cannot be installed.
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch unavailable: torch tests will be skipped"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/python examples/demo.py

test: install-dev
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15

lint: install-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy

bench: install-dev
	$(BIN)/python -m benchmarks.recovery --quick --json

clean:
	rm -rf $(VENV) .segue .pytest_cache
