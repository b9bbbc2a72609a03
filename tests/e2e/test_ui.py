"""The web UI end to end: `dagster dev` on a free port, runs launched through GraphQL as the
UI launches them, and the asset's check results seen in a real browser.

One step of the input is invalid: its run fails and its partition shows the failure, while
the checks show only what they checked (the valid steps), never "Failed".

One `dagster dev` serves the whole module, with a temporary Dagster home and a copy of
data/rollouts as the input root. It runs in its own process group, which the finalizer
stops (SIGTERM, a short wait, then SIGKILL) whether or not the tests passed.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from pipeline import cli
from pipeline import columns as c
from pipeline.io import writer
from pipeline.io.checksums import sha256_of
from pipeline.manifest import MANIFEST
from pipeline.orchestration import stage_reports as stages
from pipeline.orchestration.partitions import partition_key, rollout_steps
from pipeline.orchestration.reporting import FAILURE_TAG
from pipeline.orchestration.resources import CONFIG_ENV, INPUT_ENV, OUTPUT_ENV
from pipeline.report.serve import URL_ENV, make_server
from pipeline.transforms import metrics
from tests.support.browser import launch, open_page
from tests.support.dagster_roots import DATA, Roots, break_step_1, makefile_instance

REPO = Path(__file__).resolve().parents[2]
LOCATION = "rollout_shards"
REPOSITORY = "__repository__"
JOB = "rollout_step_job"
ASSET = "training_shards"
CHECKS = [
    "every_row_is_trained",
    "manifest_counts_add_up",
    "no_rows_quarantined",
    "rank_files_match_manifest",
    "rollouts_stay_in_one_train_step",
]
# The rollout metrics (CONTRACT section 7) that every step of data/rollouts has.
PLOTTED = [
    stages.metric_key(name)
    for name in (
        f"{metrics.RESPONSE_LEN}mean",
        f"{metrics.RESPONSE_LEN}max",
        metrics.TRUNCATED_RATIO,
        metrics.RAW_REWARD,
        metrics.ALL_ZERO_PERCENTAGE,
        metrics.RANK_TOKENS_MAX_OVER_MEAN,
        metrics.UNTRAINED_RATIO,
    )
]
# An invalid step (two rows break response_within_tokens) and a valid one launched as
# single runs, in that order, and two more as a backfill, as the UI does each.
INVALID_STEP = 1
INVALID_RULE = "response_within_tokens"
RUN_STEP = 2
BACKFILL_STEPS = [3, 4]
SCREENSHOTS_ENV = "ROLLOUT_SHARDS_SCREENSHOTS"

# Bounded waits, generous for a loaded 2-core CI machine; nothing asserts on durations.
LOAD_TIMEOUT_S = 240.0
RUN_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0
POLL_S = 0.5
LOG_TAIL_LINES = 60

# `dagster dev` maps SIGTERM onto its SIGINT handler. A shell's background job starts with
# SIGINT ignored, and then dagster dev ignores SIGTERM too: restore the default before exec.
EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
TERMINAL_RUN_STATUSES = {"SUCCESS", "FAILURE", "CANCELED"}
REPOSITORY_SELECTOR = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
# The server is on loopback: no HTTP(S)_PROXY from the environment in between.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class DagsterDev:
    """A running `dagster dev` and the roots it reads and writes."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    roots: Roots
    # `rollout-shards report ROOT --serve` beside it, as `make ui` starts it
    reports: http.server.HTTPServer

    @property
    def report_url(self) -> str:
        """ROLLOUT_SHARDS_REPORT_URL: where the reports' server answers."""
        return f"http://127.0.0.1:{self.reports.server_address[1]}"

    def log_tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def post(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON answer of the GraphQL endpoint; raises on a connection failure."""
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with LOOPBACK.open(request, timeout=30) as response:
            return json.load(response)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `data` of a GraphQL answer, failing with the errors and the server log."""
        answer = self.post(query, variables)
        assert not answer.get("errors"), f"GraphQL errors: {answer['errors']}\n{self.log_tail()}"
        return answer["data"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(tmp: Path) -> DagsterDev:
    roots = Roots(input=tmp / "rollouts", output=tmp / "shards")
    shutil.copytree(DATA, roots.input)
    break_step_1(roots)
    # the instance `make ui` serves: the Makefile's dagster.yaml (no sign-up modal)
    home = makefile_instance(tmp / "dagster_home")
    # the output root's reports served before anything is built, as `make ui` does
    reports = make_server(roots.output, port=0)
    threading.Thread(target=reports.serve_forever, daemon=True).start()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        INPUT_ENV: str(roots.input),
        OUTPUT_ENV: str(roots.output),
        URL_ENV: f"http://127.0.0.1:{reports.server_address[1]}",
    }
    env.pop(CONFIG_ENV, None)
    port = _free_port()
    dagster = Path(sys.executable).parent / "dagster"
    command = [str(dagster), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    log = tmp / "dagster_dev.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", EXEC_WITH_DEFAULT_SIGINT, *command],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return DagsterDev(
        url=f"http://127.0.0.1:{port}", process=process, log=log, roots=roots, reports=reports
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, a short wait, then SIGKILL to what is left
    (code server, run workers), and a bounded wait for the group to be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_S)


WORKSPACE_QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { repositories { name } }
          ... on PythonError { message }
        }
      }
    }
    ... on PythonError { message }
  }
}
"""


def _wait_until_loaded(server: DagsterDev) -> dict[str, Any]:
    """Poll `workspaceOrError` until the code location is LOADED; the webserver answers
    before the code server has loaded the definitions."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    last: object = "no answer yet"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(
                f"dagster dev exited with {server.process.returncode} before the code "
                f"location loaded\n{server.log_tail()}"
            )
        try:
            data = server.graphql(WORKSPACE_QUERY)
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
            last = exc
        else:
            workspace = last = data["workspaceOrError"]
            entries = {e["name"]: e for e in workspace.get("locationEntries", [])}
            entry = entries.get(LOCATION)
            if entry is not None and entry["loadStatus"] == "LOADED":
                location = entry["locationOrLoadError"]
                assert location["__typename"] == "RepositoryLocation", (
                    f"code location {LOCATION} failed to load: {location}\n{server.log_tail()}"
                )
                return location
        time.sleep(POLL_S)
    pytest.fail(
        f"code location {LOCATION} not LOADED within {LOAD_TIMEOUT_S:.0f} s; last answer: "
        f"{last}\n{server.log_tail()}"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    """`dagster dev` with the code location loaded; stopped through its process group."""
    server = _start(tmp_path_factory.mktemp("ui"))
    try:
        _wait_until_loaded(server)
        yield server
    finally:
        _stop(server.process)
        server.reports.shutdown()
        server.reports.server_close()


ADD_PARTITION = """
mutation AddPartition($name: String!, $key: String!, $repository: RepositorySelector!) {
  addDynamicPartition(
    partitionsDefName: $name, partitionKey: $key, repositorySelector: $repository
  ) {
    __typename
    ... on Error { message }
  }
}
"""

LAUNCH_RUN = """
mutation LaunchRun($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}
"""

LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""

PARTITION_KEYS = """
{
  assetNodes(assetKeys: [{path: ["training_shards"]}]) {
    partitionKeysByDimension { name partitionKeys }
  }
}
"""

RUN_STATUS = """
query RunStatus($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { status tags { key value } }
  }
}
"""

BACKFILL_RUNS = """
query BackfillRuns($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill { status runs(limit: 10) { runId status tags { key value } } }
  }
}
"""


@dataclass
class Launched:
    invalid_run_id: str
    run_id: str
    backfill_id: str


def _launch_step(server: DagsterDev, step: int) -> str:
    """A run of the step job on one partition, as "Materialize" on the partition does."""
    run = server.graphql(
        LAUNCH_RUN,
        {
            "params": {
                "selector": {**REPOSITORY_SELECTOR, "jobName": JOB},
                "executionMetadata": {
                    "tags": [{"key": "dagster/partition", "value": partition_key(step)}]
                },
            }
        },
    )["launchRun"]
    assert run["__typename"] == "LaunchRunSuccess", run
    return run["run"]["runId"]


@pytest.fixture(scope="module")
def launched(server: DagsterDev) -> Launched:
    """Partitions added by hand, a run for the invalid step, one for a valid step and a
    backfill of two more, all through GraphQL. The invalid step's run finishes before the
    others launch (a valid step then follows an invalid one); the others overlap."""
    for step in [INVALID_STEP, RUN_STEP, *BACKFILL_STEPS]:
        added = server.graphql(
            ADD_PARTITION,
            {
                "name": rollout_steps.name,
                "key": partition_key(step),
                "repository": REPOSITORY_SELECTOR,
            },
        )["addDynamicPartition"]
        assert added["__typename"] == "AddDynamicPartitionSuccess", added
    invalid_run_id = _launch_step(server, INVALID_STEP)
    _wait_for_run(server, invalid_run_id)
    run_id = _launch_step(server, RUN_STEP)
    # What "Materialize all" -> "Launch backfill" sends for the asset graph.
    backfill = server.graphql(
        LAUNCH_BACKFILL,
        {
            "params": {
                "assetSelection": [
                    {"path": [name]} for name in ("rollout_samples", "train_batch", ASSET)
                ],
                "partitionNames": [partition_key(step) for step in BACKFILL_STEPS],
            }
        },
    )["launchPartitionBackfill"]
    assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
    return Launched(
        invalid_run_id=invalid_run_id, run_id=run_id, backfill_id=backfill["backfillId"]
    )


def _tags(run: dict[str, Any]) -> dict[str, str]:
    return {tag["key"]: tag["value"] for tag in run["tags"]}


def _wait_for_run(server: DagsterDev, run_id: str) -> dict[str, Any]:
    """A run once it has finished (the daemon dequeues and launches it)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = server.graphql(RUN_STATUS, {"runId": run_id})["runOrError"]
        if run.get("status") in TERMINAL_RUN_STATUSES:
            return run
        time.sleep(POLL_S)
    pytest.fail(
        f"run {run_id} not finished within {RUN_TIMEOUT_S:.0f} s: {run}\n{server.log_tail()}"
    )


@pytest.fixture(scope="module")
def finished_run(server: DagsterDev, launched: Launched) -> dict[str, Any]:
    """The valid step's single run once it has finished."""
    return _wait_for_run(server, launched.run_id)


def _manifest(roots: Roots, step: int) -> dict[str, Any]:
    return json.loads((writer.step_folder(roots.output, step) / MANIFEST).read_text())


def test_code_location_lists_the_project(server: DagsterDev) -> None:
    data = server.graphql(
        """
        query Repository($selector: RepositorySelector!) {
          repositoryOrError(repositorySelector: $selector) {
            __typename
            ... on Repository {
              jobs { name }
              assetNodes { assetKey { path } }
              sensors { name sensorState { status } }
              schedules { name scheduleState { status } }
            }
          }
        }
        """,
        {"selector": REPOSITORY_SELECTOR},
    )
    repository = data["repositoryOrError"]
    assert repository["__typename"] == "Repository", repository
    assert JOB in {job["name"] for job in repository["jobs"]}
    assert {"/".join(n["assetKey"]["path"]) for n in repository["assetNodes"]} == {
        "rollout_samples",
        "train_batch",
        ASSET,
    }
    # All start stopped; the UI's Automation page turns them on.
    assert sorted((s["name"], s["sensorState"]["status"]) for s in repository["sensors"]) == [
        ("rollout_shards_automation_sensor", "STOPPED"),
        ("rollout_steps_sensor", "STOPPED"),
    ]
    assert [(s["name"], s["scheduleState"]["status"]) for s in repository["schedules"]] == [
        ("stale_shards_schedule", "STOPPED")
    ]


def test_launched_run_succeeds_and_writes_the_step(
    server: DagsterDev, finished_run: dict[str, Any], tmp_path: Path
) -> None:
    assert finished_run["status"] == "SUCCESS", server.log_tail()
    assert _tags(finished_run)["dagster/partition"] == partition_key(RUN_STEP)

    folder = writer.step_folder(server.roots.output, RUN_STEP)
    manifest = _manifest(server.roots, RUN_STEP)
    ranks = [o for o in manifest["outputs"] if o["path"].startswith("rank=")]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [MANIFEST, *(o["path"] for o in ranks), manifest["report"]]
    )
    assert [o["path"] for o in ranks] == [
        writer.rank_file(r) for r in range(manifest["settings"]["dp_size"])
    ]
    for output in ranks:
        assert sha256_of(folder / output["path"]) == output["sha256"]
    assert sum(o["rows"] for o in ranks) == manifest["counts"]["written"] > 0

    # The UI's run writes the bytes the command line writes for the same input (the
    # pristine copy: the server's has the invalid step).
    cli_out = tmp_path / "cli"
    assert cli.main(["build", str(DATA), "--out", str(cli_out)]) == 0
    for output in ranks:
        cli_file = writer.step_folder(cli_out, RUN_STEP) / output["path"]
        assert (folder / output["path"]).read_bytes() == cli_file.read_bytes()


MATERIALIZATIONS = """
query Materializations($partition: String!) {
  assetOrError(assetKey: {path: ["training_shards"]}) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: [$partition]) {
        partition
        runId
        metadataEntries {
          label
          __typename
          ... on IntMetadataEntry { intValue }
          ... on FloatMetadataEntry { floatValue }
          ... on BoolMetadataEntry { boolValue }
          ... on PathMetadataEntry { path }
          ... on UrlMetadataEntry { url }
          ... on MarkdownMetadataEntry { mdStr }
          ... on TableMetadataEntry { table { records } }
        }
      }
    }
  }
}
"""


def test_materialization_metadata_matches_the_manifest(
    server: DagsterDev, launched: Launched, finished_run: dict[str, Any]
) -> None:
    asset = server.graphql(MATERIALIZATIONS, {"partition": partition_key(RUN_STEP)})["assetOrError"]
    assert asset["__typename"] == "Asset", asset
    (event,) = asset["assetMaterializations"]
    assert (event["partition"], event["runId"]) == (partition_key(RUN_STEP), launched.run_id)
    entries = {e["label"]: e for e in event["metadataEntries"]}

    manifest = _manifest(server.roots, RUN_STEP)
    rows = [json.loads(record) for record in entries["rows"]["table"]["records"]]
    assert {row["name"]: row["rows"] for row in rows} == manifest["counts"]
    layout = [json.loads(record) for record in entries["layout"]["table"]["records"]]
    assert {line["name"]: line["value"] for line in layout} == {
        "is_compact": manifest["is_compact"],
        "global_batch_size": manifest["global_batch_size"],
        "dynamic_global_batch_size": manifest["dynamic_global_batch_size"],
        "num_train_steps": manifest["num_train_steps"],
    }
    assert entries["dagster/partition_row_count"]["intValue"] == manifest["counts"]["written"]
    for name, value in manifest["stats"].items():
        assert entries[stages.metric_key(name)]["floatValue"] == value, name
    assert entries["path"]["path"] == str(writer.step_folder(server.roots.output, RUN_STEP))
    ranks = [json.loads(record) for record in entries["ranks"]["table"]["records"]]
    assert ranks == [
        {"file": o["path"], "rows": o["rows"], "tokens": o["tokens"]}
        for o in manifest["outputs"]
        if o["path"].startswith("rank=")
    ]
    # the step's report: linked where the reports are served (ROLLOUT_SHARDS_REPORT_URL;
    # unset, a file URI: tests/core/test_report_serve.py), and three of its figures inline
    assert entries["report"]["url"] == f"{server.report_url}/step={RUN_STEP}/{manifest['report']}"
    assert entries["report_figures"]["mdStr"].count("](data:image/svg+xml;base64,") == 3


CHECK_EXECUTIONS = """
query CheckExecutions($check: String!, $partition: String!) {
  assetCheckExecutions(
    assetKey: {path: ["training_shards"]}, checkName: $check, partition: $partition, limit: 5
  ) {
    runId
    status
    partition
    evaluation { success severity description }
  }
}
"""


def test_asset_checks_passed_on_the_partition(
    server: DagsterDev, launched: Launched, finished_run: dict[str, Any]
) -> None:
    for check in CHECKS:
        executions = server.graphql(
            CHECK_EXECUTIONS, {"check": check, "partition": partition_key(RUN_STEP)}
        )["assetCheckExecutions"]
        assert [(e["runId"], e["status"], e["partition"]) for e in executions] == [
            (launched.run_id, "SUCCEEDED", partition_key(RUN_STEP))
        ], check
        assert executions[0]["evaluation"]["success"] is True, executions[0]


CHECK_PARTITIONS = """
{
  assetNodes(assetKeys: [{path: ["training_shards"]}]) {
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          partitionStatuses {
            ... on AssetCheckDefaultPartitionStatuses {
              succeededPartitions
              failedPartitions
              executionFailedPartitions
              skippedPartitions
              inProgressPartitions
            }
          }
        }
      }
    }
  }
}
"""

RUN_FAILURE = """
query RunFailure($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      status
      tags { key value }
      eventConnection(limit: 500) {
        events {
          __typename
          ... on ExecutionStepFailureEvent {
            stepKey
            error { message }
            failureMetadata { metadataEntries { label } }
          }
        }
      }
    }
  }
}
"""

ASSET_PARTITIONS = """
query AssetPartitions($name: String!) {
  assetNodes(assetKeys: [{path: [$name]}]) {
    assetPartitionStatuses {
      ... on DefaultPartitionStatuses { materializedPartitions failedPartitions }
    }
  }
}
"""


def test_the_refused_step_fails_its_run_and_its_partition(
    server: DagsterDev, launched: Launched, finished_run: dict[str, Any]
) -> None:
    """The invalid step's run failed at the step with the rules' summary and its rows as
    metadata; each of the step's assets shows the partition failed, not missing."""
    run = server.graphql(RUN_FAILURE, {"runId": launched.invalid_run_id})["runOrError"]
    assert run["status"] == "FAILURE", server.log_tail()
    assert INVALID_RULE in _tags(run)[FAILURE_TAG]
    (failure,) = [
        e
        for e in run["eventConnection"]["events"]
        if e["__typename"] == "ExecutionStepFailureEvent"
    ]
    assert failure["stepKey"] == "rollout_samples"
    assert f"rule {INVALID_RULE}" in failure["error"]["message"]
    labels = {entry["label"] for entry in failure["failureMetadata"]["metadataEntries"]}
    assert labels >= {"invalid_rows_per_rule", "first_offending_rows"}
    assert not writer.step_folder(server.roots.output, INVALID_STEP).exists()
    for asset in ("rollout_samples", "train_batch", ASSET):
        (node,) = server.graphql(ASSET_PARTITIONS, {"name": asset})["assetNodes"]
        statuses = node["assetPartitionStatuses"]
        assert statuses["failedPartitions"] == [partition_key(INVALID_STEP)], asset
        assert partition_key(RUN_STEP) in statuses["materializedPartitions"], asset


RULE_CHECK_EXECUTIONS = """
query RuleCheck($partition: String!) {
  assetCheckExecutions(
    assetKey: {path: ["rollout_samples"]}, checkName: "step_keeps_every_rule",
    partition: $partition, limit: 5
  ) {
    runId
    status
    evaluation { success severity description metadataEntries { label } }
  }
}
"""


def test_the_refused_step_fails_its_rule_check(
    server: DagsterDev, launched: Launched, finished_run: dict[str, Any]
) -> None:
    """Red, not an observation: the refused partition's `step_keeps_every_rule` failed with
    the command line's lines and the offending rows as metadata."""
    (execution,) = server.graphql(
        RULE_CHECK_EXECUTIONS, {"partition": partition_key(INVALID_STEP)}
    )["assetCheckExecutions"]
    assert (execution["runId"], execution["status"]) == (launched.invalid_run_id, "FAILED")
    evaluation = execution["evaluation"]
    assert (evaluation["success"], evaluation["severity"]) == (False, "ERROR")
    assert evaluation["description"].startswith(f"rollout-shards: build: step {INVALID_STEP}: ")
    assert f"rule {INVALID_RULE}" in evaluation["description"]
    labels = {entry["label"] for entry in evaluation["metadataEntries"]}
    assert labels >= {"refused", "rules", "first_offending_rows", "files"}


def test_the_refused_step_leaves_no_check_execution(
    server: DagsterDev, launched: Launched, finished_run: dict[str, Any]
) -> None:
    for check in CHECKS:
        executions = server.graphql(
            CHECK_EXECUTIONS, {"check": check, "partition": partition_key(INVALID_STEP)}
        )["assetCheckExecutions"]
        assert executions == [], check


@pytest.fixture(scope="module")
def finished_backfill(server: DagsterDev, launched: Launched) -> list[dict[str, Any]]:
    """The backfill's runs once one per partition has finished (the backfill daemon picks
    the backfill up on its next tick, up to 30 s after the launch)."""
    keys = {partition_key(step) for step in BACKFILL_STEPS}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        backfill = server.graphql(BACKFILL_RUNS, {"backfillId": launched.backfill_id})
        runs = backfill["partitionBackfillOrError"]["runs"]
        finished = [run for run in runs if run["status"] in TERMINAL_RUN_STATUSES]
        if {_tags(run).get("dagster/partition") for run in finished} >= keys:
            return runs
        time.sleep(POLL_S)
    pytest.fail(
        f"backfill {launched.backfill_id} not finished within {RUN_TIMEOUT_S:.0f} s: "
        f"{runs}\n{server.log_tail()}"
    )


def test_backfill_materializes_every_partition_with_its_checks(
    server: DagsterDev, finished_run: dict[str, Any], finished_backfill: list[dict[str, Any]]
) -> None:
    keys = {partition_key(step) for step in BACKFILL_STEPS}
    runs = finished_backfill
    assert sorted((_tags(r)["dagster/partition"], r["status"]) for r in runs) == [
        (key, "SUCCESS") for key in sorted(keys)
    ], server.log_tail()
    for step in BACKFILL_STEPS:
        assert _manifest(server.roots, step)["counts"]["written"] > 0
    (node,) = server.graphql(CHECK_PARTITIONS)["assetNodes"]
    statuses = {
        check["name"]: check["partitionStatuses"] for check in node["assetChecksOrError"]["checks"]
    }
    assert set(statuses) == set(CHECKS)
    # Every published step passed every check; the refused one has no check status at all.
    for check, status in statuses.items():
        assert set(status.pop("succeededPartitions")) >= keys | {partition_key(RUN_STEP)}, check
        assert status == {
            "failedPartitions": [],
            "executionFailedPartitions": [],
            "skippedPartitions": [],
            "inProgressPartitions": [],
        }, check
    partitions = server.graphql(PARTITION_KEYS)["assetNodes"][0]["partitionKeysByDimension"]
    # Dynamic partitions keep the order they were added in.
    assert partitions == [
        {
            "name": "default",
            "partitionKeys": [partition_key(s) for s in [INVALID_STEP, RUN_STEP, *BACKFILL_STEPS]],
        }
    ]


def test_browser_shows_the_partition_and_its_check_results(
    server: DagsterDev,
    finished_run: dict[str, Any],
    finished_backfill: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    assert finished_run["status"] == "SUCCESS", server.log_tail()
    key = partition_key(RUN_STEP)
    written = _manifest(server.roots, RUN_STEP)["counts"]["written"]
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = open_page(browser, 1400, 1000)

            page.goto(f"{server.url}/assets")
            _shows_no_onboarding_prompt(page)
            page.screenshot(path=tmp_path / "first_page.png", full_page=True)

            page.goto(f"{server.url}/assets/{ASSET}?view=partitions&partition={key}")
            _shows_partition(page, key, written)
            page.screenshot(path=tmp_path / "partition.png", full_page=True)
            page.get_by_text("num_rollouts", exact=True).first.scroll_into_view_if_needed()
            page.screenshot(path=tmp_path / "partition_tables.png")
            # last on the partition's page: the check follows the report's link away from it
            _shows_report_link_and_figures(page, server)
            page.screenshot(path=tmp_path / "partition_report.png", full_page=True)

            invalid = partition_key(INVALID_STEP)
            page.goto(f"{server.url}/assets/{ASSET}?view=partitions&partition={invalid}")
            _shows_failed_partition(page, invalid)
            page.screenshot(path=tmp_path / "failed_partition.png", full_page=True)
            page.goto(f"{server.url}/assets/rollout_samples?view=checks")
            _shows_why_the_partition_failed(page, invalid, server.roots)
            page.screenshot(path=tmp_path / "failed_partition_reason.png", full_page=True)

            page.goto(f"{server.url}/assets/{ASSET}?view=checks")
            _shows_checks(page)
            page.screenshot(path=tmp_path / "checks.png", full_page=True)

            page.goto(f"{server.url}/assets/{ASSET}?view=lineage")
            _shows_checks_passed_in_lineage(page)
            page.screenshot(path=tmp_path / "lineage.png")

            page.goto(f"{server.url}/assets/{ASSET}")
            _shows_columns_and_metric_plots(page)
            page.screenshot(path=tmp_path / "overview.png", full_page=True)
            page.screenshot(path=tmp_path / "plots.png")

            page.goto(f"{server.url}/assets/rollout_samples")
            _shows_sample_columns(page)
            page.screenshot(path=tmp_path / "samples.png", full_page=True)
        finally:
            browser.close()
    shots = [
        "first_page",
        "partition",
        "partition_report",
        "partition_tables",
        "failed_partition",
        "failed_partition_reason",
        "lineage",
        "checks",
        "overview",
        "plots",
        "samples",
    ]
    for shot in shots:
        assert (tmp_path / f"{shot}.png").stat().st_size > 0
    # To look at them: ROLLOUT_SHARDS_SCREENSHOTS=<folder> keeps a copy.
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(tmp_path / f"{shot}.png", Path(keep) / f"{shot}.png")


def _shows_partition(page: Page, key: str, written: int) -> None:
    """The partition's page: materialized, with the manifest counts as metadata."""
    expect(page.get_by_text("Materialized", exact=True).first).to_be_visible()
    metadata = page.get_by_role("row").filter(has=page.get_by_text("written", exact=True))
    expect(metadata.first).to_contain_text(str(written))
    expect(page.get_by_text("rank=0.parquet", exact=True).first).to_be_visible()
    expect(page.get_by_text(key, exact=True).first).to_be_visible()


def _shows_report_link_and_figures(page: Page, server: DagsterDev) -> None:
    """The partition's `report_figures` Markdown, opened, shows its three figures drawn; its
    `report` link, clicked, opens the step's page in a new tab from the reports' server,
    with its five figures."""
    url = f"{server.report_url}/step={RUN_STEP}/report.html"
    expect(page.get_by_text("report_figures", exact=True).first).to_be_attached()
    # Markdown metadata is shown behind its own button, in a dialog
    show = page.get_by_text("[Show Markdown]", exact=True)
    expect(show).to_have_count(1)  # report_figures is the asset's only Markdown entry
    show.click()
    dialog = page.get_by_role("dialog")
    images = dialog.locator('img[src^="data:image/svg+xml;base64,"]')
    expect(images).to_have_count(3)
    drawn = images.evaluate_all("(all) => all.map((img) => img.complete && img.naturalWidth)")
    assert len(drawn) == 3 and all(width > 0 for width in drawn), drawn
    expect(dialog.locator(f'a[href="{url}"]')).to_have_count(1)  # the whole report
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)

    link = page.locator(f'a[href="{url}"]').first
    expect(link).to_be_visible()
    with page.context.expect_page() as opened:
        link.click()
    report = opened.value
    report.wait_for_load_state()
    assert report.url == url
    expect(report.locator("h1")).to_have_text(f"Step {RUN_STEP}")
    figures = report.locator("figure > svg")
    expect(figures).to_have_count(5)
    sizes = figures.evaluate_all("(all) => all.map((svg) => svg.getBBox().width)")
    assert all(width > 0 for width in sizes), sizes
    report.close()


def _shows_failed_partition(page: Page, key: str) -> None:
    """The refused step's partition: failed by its run, with nothing materialized and no
    observation (nothing green about it)."""
    expect(page.get_by_text(key, exact=True).first).to_be_visible()
    expect(page.get_by_text("failed, and did not materialize this asset.").first).to_be_visible()
    expect(page.get_by_text("Materialized", exact=True)).to_have_count(0)
    expect(page.get_by_text("Observation", exact=True)).to_have_count(0)


def _shows_no_onboarding_prompt(page: Page) -> None:
    """`make ui`'s instance opens on the project: no Dagster community sign-up dialog."""
    expect(page.get_by_text(ASSET, exact=True).first).to_be_visible()
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page.get_by_text(re.compile("community", re.IGNORECASE))).to_have_count(0)


def _shows_why_the_partition_failed(page: Page, key: str, roots: Roots) -> None:
    """`rollout_samples`' checks: `step_keeps_every_rule` is failed (red), and its execution
    history lists the refused partition as failed, by the refused run's lines (their
    metadata, the rules and the first offending rows, are checked through GraphQL by
    `test_the_refused_step_fails_its_rule_check`)."""
    check = page.get_by_text("step_keeps_every_rule", exact=True).first
    expect(check).to_be_visible()
    expect(page.get_by_text("Failed", exact=True).first).to_be_visible()  # the list's status
    check.click()
    page.get_by_role("tab", name="Execution history").click()
    expect(page.get_by_text(key, exact=True).first).to_be_visible()
    expect(page.get_by_text("Failed", exact=True).first).to_be_visible()


def _shows_checks(page: Page) -> None:
    """The Checks tab: every check listed as succeeded, none failed although one step was
    refused, and the selected one's latest execution passed on one of the valid partitions
    (whichever run finished last)."""
    for check in CHECKS:
        expect(page.get_by_text(check, exact=True).first).to_be_visible()
    expect(page.get_by_text("Succeeded", exact=True)).to_have_count(len(CHECKS))
    expect(page.get_by_text("Passed", exact=True).first).to_be_visible()
    for status in ("Failed", "Execution failed", "Skipped"):
        expect(page.get_by_text(status, exact=True)).to_have_count(0)
    launched = "|".join(partition_key(step) for step in [RUN_STEP, *BACKFILL_STEPS])
    expect(page.get_by_text(re.compile(f"^({launched})$")).first).to_be_visible()


def _shows_checks_passed_in_lineage(page: Page) -> None:
    """The asset's node in the lineage graph: every check passed, one partition failed."""
    expect(page.get_by_text(ASSET, exact=True).first).to_be_visible()
    passed = re.compile(rf"^{len(CHECKS)}\s*/\s*{len(CHECKS)} Passed$")
    expect(page.get_by_text(passed).first).to_be_visible()
    expect(page.get_by_text(re.compile(r"\(1 failed\)")).first).to_be_visible()


def _shows_columns_and_metric_plots(page: Page) -> None:
    """The Overview tab: the Columns table lists every shard column with its description,
    and the Metadata section's Plots view charts the rollout metrics across partitions
    (one titled chart, drawn on a canvas, per numeric metadata key)."""
    expect(page.get_by_text("Columns", exact=True).first).to_be_visible()
    for name, description in c.DATASET_DESCRIPTIONS.items():
        expect(page.get_by_text(name, exact=True).first).to_be_attached()
        expect(page.get_by_text(description, exact=True).first).to_be_attached()
    page.get_by_role("button", name="Plots").click()
    for metric in PLOTTED:
        title = page.get_by_text(metric, exact=True).first
        title.scroll_into_view_if_needed()
        expect(title).to_be_visible()
    expect(page.locator("canvas").nth(len(PLOTTED) - 1)).to_be_attached()
    # Only the rollout metrics (and Dagster's row count) are charted: no count comes
    # between them, whatever order the charts take.
    titles = page.evaluate(CHART_TITLES)
    assert set(PLOTTED) <= set(titles), titles
    assert not set(titles) & {"ingested", "written", "trimmed", "global_batch_size"}, titles
    page.get_by_text(PLOTTED[0], exact=True).first.scroll_into_view_if_needed()


# The title of each chart of the Plots view: the first line of the grid cell of its canvas.
CHART_TITLES = """
() => Array.from(document.querySelectorAll('canvas')).map((canvas) => {
  let cell = canvas;
  while (cell.parentElement && getComputedStyle(cell.parentElement).display !== 'grid') {
    cell = cell.parentElement;
  }
  return cell.innerText.split('\\n')[0].trim();
})
"""


def _shows_sample_columns(page: Page) -> None:
    """`rollout_samples`' Columns table describes the input columns."""
    expect(page.get_by_text("Columns", exact=True).first).to_be_visible()
    for name in (c.INDEX, c.STATUS, c.RESPONSE_LENGTH, c.REWARD):
        expect(page.get_by_text(stages.INPUT_DESCRIPTIONS[name], exact=True).first).to_be_attached()
