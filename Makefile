# jobq — `make run` serves the API with its workers; `make test` runs the tests.
# Each target creates .venv and installs what it needs first: `run` the service alone
# (`pip install -e .`), the tests and tools its dev extra too (`-e '.[dev]'`), each once (a stamp
# file in .venv says it is done, redone when pyproject.toml changes).

.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_INSTALLED := $(VENV)/.installed-run
DEV_INSTALLED := $(VENV)/.installed-dev
DOCS_INSTALLED := $(VENV)/.installed-docs
PIP_INSTALL := $(BIN)/pip install --quiet --disable-pip-version-check
# pytest-xdist processes for `make test`, each with a database of its own. The tests wait on
# processes, sockets and timers as much as on the CPU, so on 2 cores 4 workers keep both busy
# where 3 left a core idle while the others waited.
# `make test TEST_WORKERS=N`.
TEST_WORKERS ?= 4
# The tests outside the fault scenarios need neither tests/chaos nor the pytest plugins of
# schemathesis and hypothesis, which only its fuzzing uses (importing them costs every test
# process a second or two).
NOT_CHAOS := --ignore=tests/chaos -p no:schemathesis -p no:hypothesispytest

# Python keeps the bytecode of what it compiles (in __pycache__/, ignored by git) even where
# the environment asks it not to: each test process and each `python -m jobq` it starts would
# otherwise compile the project and the tests' assertion rewriting anew (seconds per process).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help run test test-unit chaos bench bench-all lint docs format worker migrate db-stop clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-9s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_INSTALLED): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e .
	@touch $@

$(DEV_INSTALLED): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev]'
	@touch $@ $(RUN_INSTALLED)

run: $(RUN_INSTALLED) ## Serve the API on http://127.0.0.1:8000: web and worker processes (Ctrl-C stops them gracefully)
	$(BIN)/python -m jobq run

test: $(DEV_INSTALLED) ## Run the tests in parallel, a fresh database per process (embedded PostgreSQL unless TEST_DATABASE_URL)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(NOT_CHAOS)

test-unit: $(DEV_INSTALLED) ## Run the tests that need no database (-m 'not db': tests/conftest.py marks db each test with a database fixture)
	$(BIN)/pytest -m 'not db and not chaos' $(NOT_CHAOS)

chaos: $(DEV_INSTALLED) ## Run the fault, fuzz and load scenarios (real processes; prints JSON figures)
	$(BIN)/pytest -m chaos -s tests/chaos

bench: $(DEV_INSTALLED) ## Run the headline benchmarks (BASELINE=rev compares); writes docs/benchmarks.md
	$(BIN)/python -m bench --docs docs/benchmarks.md $(if $(BASELINE),--baseline $(BASELINE))

bench-all: $(DEV_INSTALLED) ## Run every benchmark (BASELINE=rev compares); writes docs/benchmarks.md
	$(BIN)/python -m bench --all --docs docs/benchmarks.md $(if $(BASELINE),--baseline $(BASELINE))

lint: $(DEV_INSTALLED) ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

$(DOCS_INSTALLED): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[docs]'
	@touch $@ $(RUN_INSTALLED)

docs: $(DOCS_INSTALLED) ## Build the manual into site/ (reference pages from the code; a broken link fails)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

format: $(DEV_INSTALLED) ## Format the code and apply safe lint fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

worker: $(RUN_INSTALLED) ## Run a worker process alone (run as many as you like)
	$(BIN)/python -m jobq worker

migrate: $(RUN_INSTALLED) ## Apply the SQL migrations in sql/migrations/ and re-create sql/functions/
	$(BIN)/python -m jobq migrate

db-stop: $(RUN_INSTALLED) ## Stop the embedded PostgreSQL (its data stays in .pgdata/)
	$(BIN)/python -m jobq db-stop

clean: ## Remove .venv and caches (keeps .pgdata/)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
