# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INPUT ?= data/rollouts
OUTPUT ?= data/shards
# torch only writes the tests' miles .pt fixtures (reading dumps needs no torch); this pin is the CPU build this machine carries.
TORCH ?= torch==2.13.0
# The verl release the verl tests run (tests/support/verl.py), installed without its
# requirements: they would bring transformers (which asks for an older huggingface-hub
# than the one installed), peft, accelerate, wandb and more that the tests never import; the
# few its trainer-side modules import come with the `verl` extra.
VERL ?= verl==0.9.1
# The rest of the install goes through uv: it resolves the same versions as pip, and
# downloads and unpacks in parallel where pip takes one package at a time (pip took most of
# a fresh clone's install). torch stays with pip, which finds the CPU build the machine
# carries (its index settings); uv then keeps that torch, which every range here admits.
UV ?= uv>=0.5
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python

# Dagster reads its roots from the environment; INPUT and OUTPUT fill them in when unset.
ROLLOUT_SHARDS_INPUT ?= $(INPUT)
ROLLOUT_SHARDS_OUTPUT ?= $(OUTPUT)
# One Dagster home per pair of roots, so the partitions and runs of one input root never
# show with another's: .dagster_home/<input>--<output>, the paths made into one name.
ROOTS_NAME := $(subst /,_,$(patsubst /%,%,$(abspath $(ROLLOUT_SHARDS_INPUT))--$(abspath $(ROLLOUT_SHARDS_OUTPUT))))
DAGSTER_HOME := $(CURDIR)/.dagster_home/$(ROOTS_NAME)
UI_PORT ?= 3000
# The oldest Polars the core supports (the one miles pins): `make test` runs tests/core
# again in $(POLARS1_VENV), a venv holding only this Polars that sees every other package
# of $(VENV) through a .pth file.
POLARS1 ?= polars==1.42.1
POLARS1_VENV := .venv-polars1
# What that pass runs: the tests whose outcome rests on what Polars computes (reading,
# checking, planning, rewards, writing and reading back shards), in tests/core and in the
# miles dump tests. Left to the main pass alone: tests of what Polars does not compute
# (the reference and packing, pure Python and numpy; docs, layers, settings, manifest
# records; the command line's plumbing, locks, signals, crashes, reruns and refusal
# records; progress bars and metric event files; other readers of the shards: pyarrow, Ray
# Data, Hugging Face datasets), and the grids that compare one reader of
# the project with another on the same Polars (in parts, in shares, the speed switches):
# each of those paths runs here on a step of its own against the in-memory build.
POLARS1_TESTS := $(addprefix tests/core/,test_bad_inputs.py \
	test_build_sequence.py test_columns.py test_commands_json.py \
	test_dataset.py::test_scan_parquet_reads_every_committed_step \
	test_differential.py test_dump_pickle.py test_flops.py test_messages.py test_metrics.py \
	test_parity.py test_parquet_pages.py test_parquet_reader.py test_plan.py test_quarantine.py \
	test_rank_writes.py test_readers.py test_repair.py \
	test_reward_groups.py test_schedule.py test_schema_rules.py test_shard_bytes.py \
	test_torch_float.py test_validate_query.py test_worked_cases.py \
	test_bounded.py::test_non_compact_step_is_trimmed_alike \
	test_bounded.py::test_ranks_written_two_at_once_or_one_alike \
	test_bounded.py::test_ranks_of_several_row_groups_from_several_spill_files_as_in_memory \
	test_shares.py::test_non_compact_step_is_trimmed_alike \
	test_shares.py::test_every_trainer_profile_alike) \
	tests/trainers/miles/test_miles_dump.py tests/trainers/miles/test_miles_dump_build.py \
	tests/trainers/miles/test_miles_flags.py tests/trainers/miles/test_staleness.py

# pytest workers; each takes whole test files, so a module's fixtures (a Ray head, dagster dev)
# start once, in the order tests/conftest.py collects them (the slowest files first). Three,
# with the Polars pass beside them, keep both cores busy to the end; a fourth measured slower
# (each worker collects the whole suite and starts its own services).
TEST_WORKERS ?= 3
# The Polars pass runs beside the main one, in one worker of its own, not after it. Its
# output goes to a temporary file: its last line is printed when the main pass is done, the
# whole of it if it failed.
POLARS1_WORKERS ?= 1
FORCE ?=
# The step reports' server (`rollout-shards report ROOT --serve`, started by `make ui` and
# `make team-reports`): the partitions' `report` links point there, so `make run`'s open in
# `make ui` on a click (docs/report.md).
REPORT_PORT ?= 3001
ROLLOUT_SHARDS_REPORT_URL ?= http://127.0.0.1:$(REPORT_PORT)
DAGSTER_ENV = DAGSTER_HOME=$(DAGSTER_HOME) ROLLOUT_SHARDS_INPUT=$(ROLLOUT_SHARDS_INPUT) \
	ROLLOUT_SHARDS_OUTPUT=$(ROLLOUT_SHARDS_OUTPUT) ROLLOUT_SHARDS_FORCE=$(FORCE) \
	ROLLOUT_SHARDS_REPORT_URL=$(ROLLOUT_SHARDS_REPORT_URL)
# dg expects the project's venv to be the active one; say it is, as `source .venv/bin/activate` would.
DG_ENV = $(DAGSTER_ENV) VIRTUAL_ENV=$(CURDIR)/$(VENV)

.PHONY: run ui test peers install lint style browser data clean team-db team-code-server team-daemon team-webserver team-reports

$(BIN)/python:
	@echo "make: creating $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Bytecode of what the commands import (the CLI, the Dagster definitions, the web UI, Ray's
# client), written once here: where PYTHONDONTWRITEBYTECODE is set (this machine) a module
# without it is compiled again by every process that imports it. Not every installed file
# (some 23,000): most are never imported. The packages only the tests import are compiled
# where they are first imported (`make test` lets its processes write bytecode).
WARM_IMPORTS = pipeline.cli, pipeline.commands, pipeline.step.build, pipeline.definitions, \
	pipeline.orchestration.run_all, dagster._cli, dagster_dg_cli.cli, dagster_webserver.cli, \
	dagster_webserver.webserver, dagster_postgres, ray, ray.job_submission
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	@echo "make: installing into $(VENV), a few minutes on a first run (1/2: $(TORCH), CPU build)"
	$(BIN)/pip install --quiet --no-compile "$(TORCH)" "$(UV)"
	@echo "make: installing (2/2: rollout-shards with its extras: Dagster, Ray, verl, object storage, test tools)"
	$(UV_INSTALL) -e ".[dev,dagster,miles,ray,k8s,verl,deploy,s3]"
	$(UV_INSTALL) --no-deps "$(VERL)"
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import $(WARM_IMPORTS)"
	touch $@

install: $(VENV)/.installed

$(POLARS1_VENV)/.installed: Makefile | $(VENV)/.installed
	@echo "make: creating $(POLARS1_VENV) ($(POLARS1) over $(VENV)'s other packages)"
	rm -rf $(POLARS1_VENV)
	$(BIN)/python -m venv --without-pip $(POLARS1_VENV)
	own=$$($(POLARS1_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') && \
	shared=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') && \
	$(BIN)/pip install --quiet --target "$$own" "$(POLARS1)" && \
	echo "import site; site.addsitedir('$$shared')" > "$$own/zz_project_venv.pth"
	touch $@

# No telemetry, and no new-user prompt (`nux`: Dagster's community sign-up modal, which
# would cover the first page of `make ui`).
$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME) && printf 'telemetry:\n  enabled: false\nnux:\n  enabled: false\n' > $@

# Every step through Dagster, in process, on the instance that `make ui` shows.
run: install $(DAGSTER_HOME)/dagster.yaml
	$(DAGSTER_ENV) $(BIN)/python -m pipeline.orchestration.run_all

# The reports' server runs beside dg dev and stops with it (Ctrl-C included: a background
# job of make's shell ignores SIGINT, so the shell's exit stops it).
ui: install $(DAGSTER_HOME)/dagster.yaml
	@$(BIN)/rollout-shards report $(ROLLOUT_SHARDS_OUTPUT) --serve --port $(REPORT_PORT) & \
	reports=$$!; trap 'kill $$reports 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	$(DG_ENV) $(BIN)/dg dev -h 127.0.0.1 -p $(UI_PORT)

# A team's deployment (docs/deploy.md): the code server, the daemon and the webserver, each a
# service of its own over one PostgreSQL instance named by DAGSTER_PG_URL (never in the repo).
TEAM_HOME ?= $(CURDIR)/.dagster_team
TEAM_PG_PORT ?= 5433
ROLLOUT_SHARDS_CODE_PORT ?= 4266
ROLLOUT_SHARDS_MAX_RUNS ?= 4
TEAM_ENV = DAGSTER_HOME=$(TEAM_HOME) ROLLOUT_SHARDS_INPUT=$(ROLLOUT_SHARDS_INPUT) \
	ROLLOUT_SHARDS_OUTPUT=$(ROLLOUT_SHARDS_OUTPUT) ROLLOUT_SHARDS_CODE_PORT=$(ROLLOUT_SHARDS_CODE_PORT) \
	ROLLOUT_SHARDS_MAX_RUNS=$(ROLLOUT_SHARDS_MAX_RUNS) ROLLOUT_SHARDS_REPORT_URL=$(ROLLOUT_SHARDS_REPORT_URL)
NEED_PG_URL = @test -n "$$DAGSTER_PG_URL" || { echo "make: set DAGSTER_PG_URL to the team's postgresql:// URL (make team-db starts one on this machine)" >&2; exit 1; }

$(TEAM_HOME)/dagster.yaml: deploy/dagster.yaml
	mkdir -p $(TEAM_HOME) && ln -sf $(CURDIR)/deploy/dagster.yaml $@

# A PostgreSQL on 127.0.0.1 for trying the deployment on one machine; prints DAGSTER_PG_URL.
team-db: install
	@$(BIN)/python deploy/local_postgres.py start $(TEAM_HOME)/postgres --port $(TEAM_PG_PORT)

team-code-server: install $(TEAM_HOME)/dagster.yaml
	$(NEED_PG_URL)
	$(TEAM_ENV) $(BIN)/dagster code-server start -h 127.0.0.1 -p $(ROLLOUT_SHARDS_CODE_PORT) \
		-m pipeline.definitions --location-name rollout_shards

team-daemon: install $(TEAM_HOME)/dagster.yaml
	$(NEED_PG_URL)
	$(TEAM_ENV) $(BIN)/dagster-daemon run -w deploy/workspace.yaml

team-webserver: install $(TEAM_HOME)/dagster.yaml
	$(NEED_PG_URL)
	$(TEAM_ENV) $(BIN)/dagster-webserver -h 127.0.0.1 -p $(UI_PORT) -w deploy/workspace.yaml

# The step reports the partitions link (ROLLOUT_SHARDS_REPORT_URL), read-only, on REPORT_PORT.
team-reports: install
	$(BIN)/rollout-shards report $(ROLLOUT_SHARDS_OUTPUT) --serve --port $(REPORT_PORT)

lint: style
	$(BIN)/mypy

style: install
	$(BIN)/ruff check pipeline tests bench loader deploy
	$(BIN)/ruff format --check pipeline tests bench loader deploy

# The browser test drives a Chromium (Debian's package by default) through the playwright
# wheel; playwright cannot download its own browser builds here. A Chromium that starts is
# used as it is: nothing is installed. Otherwise make says what it installs and why before
# apt-get installs the package and only what it requires (no recommended packages).
CHROMIUM ?= /usr/bin/chromium
browser:
	@if $(CHROMIUM) --version >/dev/null 2>&1; then exit 0; fi; \
	why="the browser test (tests/e2e/test_ui.py) drives Chromium at $(CHROMIUM), which is missing or does not start"; \
	if ! command -v apt-get >/dev/null 2>&1; then \
		echo "make: $$why; install Chromium, or name one with CHROMIUM=/path/to/chromium" >&2; \
		exit 1; \
	fi; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	echo "make: $$why."; \
	echo "make: installing the system package chromium with apt-get, without recommended packages$${sudo:+ (through sudo)};"; \
	echo "make: CHROMIUM=/path/to/chromium uses another one instead."; \
	$$sudo apt-get update -qq && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

# The trainer tests run miles' and slime's own code: before anything is installed or run,
# `make test` checks that its source can be had (MILES_SOURCE/SLIME_SOURCE, a cached clone,
# or git reaching GitHub) and otherwise stops with the script's one line.
ifneq ($(filter test peers,$(MAKECMDGOALS)),)
PEERS_MISSING := $(shell $(PYTHON) tests/peer_sources.py 2>&1)
ifneq ($(PEERS_MISSING),)
$(error $(PEERS_MISSING))
endif
endif
peers:
	@:

# mypy, the Polars pass and the main pass run side by side, whatever any of them gives; the
# last line says which failed. The passes may write bytecode
# (PYTHONDONTWRITEBYTECODE emptied): with it set, every worker and every test's subprocess
# compiled the test modules, and pytest rewrote their asserts, anew.
test: peers install style browser $(DAGSTER_HOME)/dagster.yaml $(POLARS1_VENV)/.installed
	$(BIN)/rollout-shards validate $(INPUT)
	$(DG_ENV) $(BIN)/dg check defs
	@main=0; polars1=0; typed=0; version=$$($(POLARS1_VENV)/bin/python -c 'import polars; print("Polars", polars.__version__)'); \
	scratch=$$(mktemp -d); polars1_pid=; mypy_pid=; \
	trap 'kill $$polars1_pid $$mypy_pid 2>/dev/null; rm -rf "$$scratch"' EXIT; trap 'exit 130' INT TERM; \
	echo "make: mypy, and the tests of what Polars computes (POLARS1_TESTS) on $$version, beside the main pass"; \
	$(BIN)/mypy >"$$scratch/mypy.log" 2>&1 & mypy_pid=$$!; \
	PYTHONDONTWRITEBYTECODE= $(POLARS1_VENV)/bin/python -m pytest $(POLARS1_TESTS) -n $(POLARS1_WORKERS) --dist loadfile \
		--no-loadscope-reorder --basetemp "$$scratch/tmp" >"$$scratch/polars1.log" 2>&1 & polars1_pid=$$!; \
	echo "ROLLOUT_SHARDS_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15"; \
	PYTHONDONTWRITEBYTECODE= ROLLOUT_SHARDS_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 || main=$$?; \
	wait $$mypy_pid || typed=$$?; \
	wait $$polars1_pid || polars1=$$?; \
	echo "make: mypy: $$(tail -n 1 "$$scratch/mypy.log")"; \
	echo "make: the tests of what Polars computes on $$version: $$(tail -n 1 "$$scratch/polars1.log")"; \
	if [ $$main -ne 0 ] || [ $$polars1 -ne 0 ] || [ $$typed -ne 0 ]; then \
		[ $$typed -eq 0 ] || cat "$$scratch/mypy.log"; \
		[ $$polars1 -eq 0 ] || cat "$$scratch/polars1.log"; \
		echo "make: test failed: mypy $$([ $$typed -eq 0 ] && echo passed || echo failed), the tests $$([ $$main -eq 0 ] && echo passed || echo "failed (pytest status $$main)"), the Polars tests on $$version $$([ $$polars1 -eq 0 ] && echo passed || echo "failed (pytest status $$polars1)")" >&2; \
		exit 1; \
	fi

data: install
	$(BIN)/python -m pipeline.sample_data $(INPUT)

clean:
	rm -rf $(OUTPUT) .pytest_cache
