# Everything a fresh machine needs goes through these targets; `.ci/run` calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test lint lock tools

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

# The real tools the tests check against, from Debian: prometheus and promtool (alert rules),
# chromium (the scenario report page).
tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null; then \
		if [ "$$(id -u)" != 0 ]; then echo "install Debian's prometheus and chromium packages (apt-get install prometheus chromium)"; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium >/dev/null; \
	fi

test: lint tools
	$(PY) -m pytest

# The production image's dependencies, pinned with hashes (Dockerfile: pip --require-hashes).
# Existing pins are kept while they still satisfy pyproject.toml; tests/deploy/test_lock.py
# fails when this file is out of date.
lock: setup
	$(VENV)/bin/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
		--no-header --quiet -o requirements.lock
