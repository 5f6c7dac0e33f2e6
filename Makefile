# jobq — `make run` serves the API with its workers; `make test` runs the tests.
# Both create .venv and install the project first when needed.

.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DOCS_INSTALLED := $(VENV)/.docs-installed

.PHONY: help run test chaos bench bench-all lint docs format worker migrate db-stop clean

help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-9s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

run: $(INSTALLED) ## Serve the API on http://127.0.0.1:8000: web and worker processes (Ctrl-C stops them gracefully)
	$(BIN)/python -m jobq run

test: $(INSTALLED) ## Run the tests against a fresh database (embedded PostgreSQL unless TEST_DATABASE_URL)
	$(BIN)/pytest

chaos: $(INSTALLED) ## Run the fault, fuzz and load scenarios (real processes; prints JSON figures)
	$(BIN)/pytest -m chaos -s tests/chaos

bench: $(INSTALLED) ## Run the headline benchmarks (BASELINE=rev compares); writes docs/benchmarks.md
	$(BIN)/python -m bench --docs docs/benchmarks.md $(if $(BASELINE),--baseline $(BASELINE))

bench-all: $(INSTALLED) ## Run every benchmark (BASELINE=rev compares); writes docs/benchmarks.md
	$(BIN)/python -m bench --all --docs docs/benchmarks.md $(if $(BASELINE),--baseline $(BASELINE))

lint: $(INSTALLED) ## ruff check, ruff format --check, mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

$(DOCS_INSTALLED): pyproject.toml $(INSTALLED)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[docs]'
	@touch $@

docs: $(DOCS_INSTALLED) ## Build the manual into site/ (reference pages from the code; a broken link fails)
	$(BIN)/python docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

format: $(INSTALLED) ## Format the code and apply safe lint fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

worker: $(INSTALLED) ## Run a worker process alone (run as many as you like)
	$(BIN)/python -m jobq worker

migrate: $(INSTALLED) ## Apply the SQL migrations in sql/migrations/ and re-create sql/functions/
	$(BIN)/python -m jobq migrate

db-stop: $(INSTALLED) ## Stop the embedded PostgreSQL (its data stays in .pgdata/)
	$(BIN)/python -m jobq db-stop

clean: ## Remove .venv and caches (keeps .pgdata/)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
