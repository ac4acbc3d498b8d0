# rlpulse: `make demo` runs the main job, `make test` runs the test suite. Both create .venv
# in the repo root and install everything they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlpulse-installed
EXTRAS := trainer,trackers,report,dev,serve

.PHONY: install demo demo-synthetic test test-slow lint bench clean

# torch goes first and pinned, so nothing later resolves it to a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a collector and a PPO run on Ray (a few minutes on 2 CPU cores).
demo: install
	scripts/in-netns.sh $(PY) scripts/demo.py

# Without the trainer: a collector and producer processes with a synthetic workload (seconds).
demo-synthetic: install
	$(PY) scripts/demo_synthetic.py

test: install
	bash scripts/install-system-deps.sh
	bash scripts/run-tests.sh $(PYTEST_ARGS)

test-slow: install
	bash scripts/install-system-deps.sh
	bash scripts/run-tests.sh -m slow $(PYTEST_ARGS)

bench: install
	$(PY) -m benchmarks.run

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs out .pytest_cache
