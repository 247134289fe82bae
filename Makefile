# TaskPilots: `make run` starts everything on this machine, `make test` runs the checks CI runs.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The third-party MCP servers the peer drills and tests run against (taskpilots/peers/), pinned
# by its package-lock.json and installed outside git.
PEERS := var/peers
PEERS_STAMP := $(PEERS)/.installed
# The OpenID Connect provider the single sign-on tests start (npm oidc-provider), pinned by its
# package-lock.json and installed beside it, outside git.
OIDC_PROVIDER := tests/oidc_provider
OIDC_STAMP := $(OIDC_PROVIDER)/node_modules/.installed

# The newest Python >= 3.12 we can find: python3.13, python3.12, then pyenv's versions.
PYTHON ?= $(shell for p in python3.13 python3.12 \
	$$(ls -d $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do \
	  command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; break; }; \
	done)

.PHONY: run test test-embedded lint format venv install peers oidc-provider clean-var
.DEFAULT_GOAL := run

$(PY):
	@if [ -z "$(PYTHON)" ]; then \
	  echo "TaskPilots needs Python 3.12 or newer (Django 6.1 requires it)."; \
	  echo "Install python3.12/python3.13, or with pyenv: pyenv install 3.13, then run make again."; \
	  exit 1; fi
	@echo "Creating $(VENV) with $(PYTHON)"
	@"$(PYTHON)" -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	@$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt ".[dev]"
	@touch $(STAMP)

venv install: $(STAMP)

$(PEERS_STAMP): taskpilots/peers/package.json taskpilots/peers/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  echo "Installing Node.js and npm for the MCP peer tests"; \
	  SUDO=$$([ "$$(id -u)" -ne 0 ] && command -v sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y nodejs npm; }
	@mkdir -p $(PEERS)
	@cp taskpilots/peers/package.json taskpilots/peers/package-lock.json $(PEERS)/
	@npm ci --prefix $(PEERS) --no-audit --no-fund --loglevel=error
	@touch $@

peers: $(PEERS_STAMP)

# After the peers, which install node and npm when missing.
$(OIDC_STAMP): $(OIDC_PROVIDER)/package.json $(OIDC_PROVIDER)/package-lock.json | $(PEERS_STAMP)
	@npm ci --prefix $(OIDC_PROVIDER) --no-audit --no-fund --loglevel=error
	@touch $@

oidc-provider: $(OIDC_STAMP)

run: $(STAMP)
	@$(PY) -m taskpilots.devrun

lint: $(STAMP)
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .

format: $(STAMP)
	@$(VENV)/bin/ruff check --fix .
	@$(VENV)/bin/ruff format .

# MARKS narrows the tests to a marker expression (e.g. MARKS="worker or bench").
MARKS ?=
SELECT := $(if $(MARKS),($(MARKS)) and ,)

test: $(STAMP) $(PEERS_STAMP) $(OIDC_STAMP)
	@# The browser tests drive Debian's Chromium (never `playwright install`).
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "Installing chromium for the browser tests"; \
	  SUDO=$$([ "$$(id -u)" -ne 0 ] && command -v sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y chromium; }
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@TASKPILOTS_TESTING=1 $(PY) manage.py makemigrations --check --dry-run
	@# The test settings (tests/settings.py) come from pyproject.toml: plain `pytest` gets them too.
	@$(PY) -m pytest -m "$(SELECT)not chaos" $(PYTEST_ARGS)
	@# The chaos soak restarts PostgreSQL and the broker: it runs alone, after everything else.
	@$(PY) -m pytest -m "$(SELECT)chaos" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The newcomer's configuration whatever this shell has configured: every test that starts
# workers, drills or benchmarks, on the embedded PostgreSQL and the filesystem broker, in a
# var folder of its own whose database is stopped afterwards. .ci/run runs it after `make test`.
EMBEDDED_VAR := $(CURDIR)/var/embedded-test
test-embedded: $(STAMP) $(PEERS_STAMP)
	@env -u DATABASE_URL -u CELERY_BROKER_URL -u TASKPILOTS_REDIS_URL -u CACHE_URL \
	  TASKPILOTS_VAR_DIR=$(EMBEDDED_VAR) $(MAKE) --no-print-directory test MARKS="worker or bench"; \
	  status=$$?; TASKPILOTS_VAR_DIR=$(EMBEDDED_VAR) $(PY) -m taskpilots.embedded stop; exit $$status

clean-var:
	@$(PY) -m taskpilots.embedded stop || true
	rm -rf var/
