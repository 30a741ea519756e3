# make train:      set up .venv (first time, or when requirements.txt changed) and train the default job.
# make test:       the same set-up plus requirements-test.txt, then the whole test suite (what CI runs).
# make test-fast:  the suite less the tests marked slow (end-to-end train.py runs): the inner loop.
# make bench-deps: Lightning and what it needs, for python -m bench.peers (requirements-bench.txt).
# make lint:       ruff's checks and its formatter's, over the whole repo (ruff.toml); CI runs it before the tests.
# make format:     ruff's fixes and its formatter, applied.
# make mutation:   mutation testing of the core modules (mutmut, requirements-mutation.txt): a score per
#                  module against the fast unit tests; tens of minutes, so not part of make test (docs/TESTING.md).
# Each requirements file has its own stamp in .venv: a file that changed is installed again, alone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed

.PHONY: train test test-fast lint format bench-deps mutation

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt | $(PY)
	$(PIP) -r requirements.txt
	touch $@

$(STAMP)-test: requirements-test.txt requirements-extras.txt $(STAMP)
	$(PIP) -r requirements-test.txt
	touch $@

$(STAMP)-bench: requirements-bench.txt $(STAMP)
	$(PIP) -r requirements-bench.txt
	touch $@

$(STAMP)-lint: requirements-lint.txt | $(PY)
	$(PIP) -r requirements-lint.txt
	touch $@

$(STAMP)-mutation: requirements-mutation.txt $(STAMP)-test
	$(PIP) -r requirements-mutation.txt
	touch $@

train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)-test
	$(PY) -m pytest $(ARGS)

test-fast: $(STAMP)-test
	$(PY) -m pytest -m "not slow" $(ARGS)

lint: $(STAMP)-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)-lint
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench-deps: $(STAMP)-bench

mutation: $(STAMP)-mutation
	$(PY) -m tests.mutation $(ARGS)
