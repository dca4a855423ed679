# One venv for everything; `make test` installs on first use so a clean clone needs only this.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint bench up clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench.resilience_overhead

# The whole stack as local processes until Ctrl-C; e.g. make up UP_ARGS="--detach --scale booking-agent=2".
up: $(STAMP)
	$(BIN)/concierge up $(UP_ARGS)

clean:
	rm -rf $(VENV) .concierge .pytest_cache .mypy_cache .ruff_cache
