# Everything a fresh machine needs is done here: python3, make and git are enough.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit venv clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sglang-supervisor demo --until-recovered --duration 300 $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check supervisor api probes tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

test: lint typecheck unit

clean:
	rm -rf $(VENV) build *.egg-info
