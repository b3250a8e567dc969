# Everything a fresh machine needs goes through these targets; `.ci/run` calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test lint lock

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/rollbackctl run

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy workflows activities worker cli sim
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest

# The production image's dependencies, pinned with hashes (Dockerfile: pip --require-hashes).
# Existing pins are kept while they still satisfy pyproject.toml; tests/deploy/test_lock.py
# fails when this file is out of date.
lock: setup
	$(VENV)/bin/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
		--no-header --quiet -o requirements.lock
