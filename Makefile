# make train:      set up .venv (first time, or when requirements.txt changed) and train the default job.
# make test:       the same set-up, then the whole test suite (what CI runs).
# make test-fast:  the suite less the tests marked slow (end-to-end train.py runs): the inner loop.
# make bench-deps: Lightning and what it needs, for python -m bench.peers (requirements-bench.txt).
# make mutation:   mutation testing of the core modules (mutmut, requirements-mutation.txt): a score per
#                  module against the fast unit tests; tens of minutes, so not part of make test (docs/TESTING.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: train test test-fast bench-deps mutation

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(ARGS)

bench-deps: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt

mutation: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-mutation.txt
	$(PY) -m tests.mutation $(ARGS)
