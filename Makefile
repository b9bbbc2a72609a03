# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INPUT ?= data/rollouts
OUTPUT ?= data/shards
# torch only reads miles' .pt dumps; this pin is the CPU build this machine carries.
TORCH ?= torch==2.13.0

.PHONY: run test install lint data clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,miles]"
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/rollout-shards build $(INPUT) --out $(OUTPUT)
	@echo "shards written under $(OUTPUT)/ (one step=<N>/ folder per step, manifest.json in each)"

lint: install
	$(BIN)/ruff check pipeline tests bench

test: install lint
	$(BIN)/rollout-shards validate $(INPUT)
	$(BIN)/python -m pytest

data: install
	$(BIN)/python -m pipeline.sample_data $(INPUT)

clean:
	rm -rf $(OUTPUT) .pytest_cache
