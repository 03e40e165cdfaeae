# Everything a fresh machine needs is done here: python3, make and git are enough.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit integration suite venv clean layers smoke systemd

# Parallel pytest workers (pytest-xdist). The integration tests mostly wait on real windows (stall
# windows, backoffs, grace periods), so six of them overlap well even on 2 cores; see
# docs/DECISIONS.md, "A faster suite". WORKERS=0 runs in one process (pytest -n 0).
# worksteal, not loadgroup: loadgroup keys tests by node id and runs the schemathesis cases (42
# items under 3 ids) once per id, dropping 39 tests without a word.
WORKERS ?= 6
UNIT_WORKERS ?= 2
XDIST = --dist worksteal
# Bytecode written even where PYTHONDONTWRITEBYTECODE is set (this machine sets it): without
# __pycache__ every worker rewrote and compiled about 590 test and product modules on every run (8 s
# of collection per worker here, 2.3 s with it), and every interpreter a test starts compiled the
# product again. __pycache__/ is ignored by git.
PYTEST = PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# --no-keep: the demo's temporary directory (logs, bundles, journal) is deleted at the end, so
# nothing is left in /tmp; `make demo ARGS=--keep` keeps it (the last flag wins).
demo: $(STAMP)
	$(VENV)/bin/sglang-supervisor demo --until-recovered --duration 300 --no-keep $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check supervisor api probes tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The import graph's figures (imports that run back up, circles, modules in supervisor/daemon/);
# tests/supervisor/test_import_floors.py fails when the first two are not 0.
layers: $(STAMP)
	$(PY) tests/supervisor/test_import_floors.py

# The inner loop: everything but the tests marked `integration`. A test that starts an interpreter of
# the product (the CLI, --help, a daemon, the simulator), a browser or a build, or waits out a real
# timeout of about a second or more, is marked `integration` (docs/DECISIONS.md, "A unit tier that is
# a unit tier"). Measured here (2 shared cores, 2026-12-07): 1,730 tests in 48 s under a load average
# of 8-11, against 96 s for the 1,791 tests before at a load of 3-5 (337-345 s was seen under heavier load).
unit: $(STAMP)
	$(PYTEST) -q -m "not integration" -n $(UNIT_WORKERS) $(XDIST) $(PYTEST_ARGS)

# The real daemon, simulator, py-spy and gdb tests only.
integration: $(STAMP)
	$(PYTEST) -q -m integration -n $(WORKERS) $(XDIST) $(PYTEST_ARGS)

# The whole suite, both tiers in one parallel run.
suite: $(STAMP)
	$(PYTEST) -q -n $(WORKERS) $(XDIST) $(PYTEST_ARGS)

test: lint typecheck suite

# The release smoke: build the sdist and wheel, install the wheel into a fresh venv, run it
# (tests/release/smoke.sh says what; .ci/run calls it after `make test`).
smoke: $(STAMP)
	PY=$(abspath $(PY)) tests/release/smoke.sh

# The shipped units under a real systemd, PID 1 of this machine's own namespaces: the wheel and the
# units installed as systemd/README.md says, driven with systemctl, journalctl and the CLI (tests
# marked real_systemd, which every other run deselects). Needs root; builds a Debian root file
# system once into /var/cache/sglang-supervisor-systemd (tests/systemd_real/run.sh says what).
systemd: $(STAMP)
	PY=$(abspath $(PY)) tests/systemd_real/run.sh $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
