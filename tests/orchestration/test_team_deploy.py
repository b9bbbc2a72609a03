"""A team's deployment end to end (deploy/, docs/deploy.md): a real PostgreSQL on 127.0.0.1
started by deploy/local_postgres.py, and the code server, the daemon and the webserver
started as docs/deploy.md says, each its own process over that one instance.

The daemon's sensor registers the steps and its runs go through the queue within the
global limit; two runs of one step never overlap; a daemon killed while runs wait is
restarted and drains the queue; the schedule rebuilds a step whose shards went missing;
the run history outlives a webserver restart. Every server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import psutil
import pytest
import yaml

from pipeline.manifest import MANIFEST
from pipeline.orchestration.partitions import partition_key
from pipeline.orchestration.resources import CONFIG_ENV, INPUT_ENV, OUTPUT_ENV
from pipeline.orchestration.schedules import CRON_ENV, REASON_TAG
from pipeline.step.freshness import MISSING
from tests.support.dagster_roots import DATA, most_at_once

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Three of the sample root's steps (one each of Parquet, Arrow IPC and JSON Lines): one more
# than the queue's limit, so runs wait.
STEPS = [1, 2, 3]
MAX_RUNS = 2
LOCATION = "rollout_shards"
REPOSITORY = "__repository__"
# Bounded waits, generous for a loaded 2-core machine; nothing asserts on durations.
START_TIMEOUT_S = 240.0
RUNS_TIMEOUT_S = 600.0
STOP_GRACE_S = 20.0
POLL_S = 1.0
# The run monitor's timings in the tests' instance: a run starts (its process imports
# Dagster and the definitions) in seconds, well within the timeout even on a busy machine.
MONITOR = {"start_timeout_seconds": 45, "poll_interval_seconds": 5}
ROOT_RUN = "dagster/root_run_id"  # the tag a retry carries: the run it retries
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Team:
    """The deployment's services, environment and roots."""

    tmp: Path
    env: dict[str, str]
    input: Path
    output: Path
    web_port: int
    pg_data: Path
    services: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    opened: dg.DagsterInstance | None = None

    # The commands of docs/deploy.md (`make team-code-server`, `team-daemon`, `team-webserver`).
    def command(self, name: str) -> list[str]:
        return {
            "code-server": [
                str(BIN / "dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                self.env["ROLLOUT_SHARDS_CODE_PORT"],
                "-m",
                "pipeline.definitions",
                "--location-name",
                LOCATION,
            ],
            "daemon": [str(BIN / "dagster-daemon"), "run", "-w", "deploy/workspace.yaml"],
            "webserver": [
                str(BIN / "dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.web_port),
                "-w",
                "deploy/workspace.yaml",
            ],
        }[name]

    def start(self, name: str) -> None:
        log = (self.tmp / f"{name}.log").open("ab")
        self.services[name] = subprocess.Popen(
            self.command(name),
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.services.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-40:]) if path.exists() else ""
        )

    def dagster(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "dagster"), *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"dagster {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.web_port}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with LOOPBACK.open(request, timeout=30) as response:
            answer = json.load(response)
        assert not answer.get("errors"), f"{answer['errors']}\n{self.log('webserver')}"
        return answer["data"]

    def instance(self) -> dg.DagsterInstance:
        """The deployment's instance, as the services open it (PostgreSQL from the env),
        opened once: every wait polls it, and each opening is new PostgreSQL sessions."""
        if self.opened is None:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("DAGSTER_PG_URL", self.env["DAGSTER_PG_URL"])
                self.opened = dg.DagsterInstance.from_config(self.env["DAGSTER_HOME"])
        return self.opened

    def close(self) -> None:
        if self.opened is not None:
            self.opened.dispose()
            self.opened = None

    def runs(self) -> list[dg.RunRecord]:
        return list(self.instance().get_run_records())


WORKSPACE = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename } } } } }"""
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId status } } ... on Error { message } } }"""
RUN_IDS = "{ runsOrError { ... on Runs { results { runId status } } } }"


def _wait(what: str, done: Any, team: Team, timeout: float = RUNS_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = [n for n, p in team.services.items() if p.poll() is not None]
        if exited:
            pytest.fail(f"{exited[0]} exited while waiting for {what}\n{team.log(exited[0])}")
        value = done()
        if value:
            return value
        time.sleep(POLL_S)
    logs = "\n".join(f"--- {n}\n{team.log(n)}" for n in ("daemon", "code-server", "webserver"))
    pytest.fail(f"not within {timeout:.0f} s: {what}\n{logs}")


def _webserver_loaded(team: Team) -> bool:
    try:
        entries = team.graphql(WORKSPACE)["workspaceOrError"]["locationEntries"]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return False
    return any(
        e["name"] == LOCATION
        and e["loadStatus"] == "LOADED"
        and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        for e in entries
    )


def _launch(team: Team, step: int) -> str:
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "jobName": "rollout_step_job",
        },
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition_key(step)}]},
        "mode": "default",
    }
    answer = team.graphql(LAUNCH, {"params": params})["launchRun"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    return str(answer["run"]["runId"])


def _finished(team: Team, run_ids: set[str]) -> list[dg.RunRecord] | None:
    records = [r for r in team.runs() if r.dagster_run.run_id in run_ids]
    if len(records) == len(run_ids) and all(r.dagster_run.status in TERMINAL for r in records):
        return records
    return None


def _spans(records: list[dg.RunRecord]) -> list[tuple[float, float]]:
    return [(r.start_time, r.end_time) for r in records if r.start_time and r.end_time]


def _listening(pid: int) -> set[str]:
    """The addresses the process tree of `pid` listens on."""
    addresses = set()
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    # gRPC listens on a dual-stack socket: 127.0.0.1 in its IPv6 spelling.
                    addresses.add(conn.laddr.ip.removeprefix("::ffff:"))
    return addresses


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    tmp = tmp_path_factory.mktemp("team")
    # Outside pytest's private folders: as root, the server runs as a user of its own.
    pg_data = Path(tempfile.mkdtemp(prefix="rollout-shards-pg-")) / "data"
    pg_data.parent.chmod(0o755)
    url = subprocess.run(
        [
            sys.executable,
            str(REPO / "deploy" / "local_postgres.py"),
            "start",
            str(pg_data),
            "--port",
            str(_free_port()),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=START_TIMEOUT_S,
    ).stdout.strip()
    home = tmp / "home"
    home.mkdir()
    # The team's instance file, but for how long the run monitor lets a run start: a run the
    # killed daemon left STARTING is failed and retried after that, which is the point of
    # `test_a_killed_daemon_restarts_and_drains_the_queue`, not the two minutes of waiting.
    config = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    config["run_monitoring"].update(MONITOR)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    team = Team(
        tmp=tmp,
        env={},
        input=tmp / "rollouts",
        output=tmp / "shards",
        web_port=_free_port(),
        pg_data=pg_data,
    )
    shutil.copytree(
        DATA, team.input, ignore=lambda _, names: [n for n in names if n.startswith("step=4")]
    )
    team.env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": url,
        "ROLLOUT_SHARDS_CODE_PORT": str(_free_port()),
        "ROLLOUT_SHARDS_MAX_RUNS": str(MAX_RUNS),
        CRON_ENV: "* * * * *",
        INPUT_ENV: str(team.input),
        OUTPUT_ENV: str(team.output),
    }
    team.env.pop(CONFIG_ENV, None)
    try:
        team.start("code-server")
        team.start("daemon")
        team.start("webserver")
        _wait(
            "the webserver loads the code location",
            lambda: _webserver_loaded(team),
            team,
            START_TIMEOUT_S,
        )
        yield team
    finally:
        team.close()
        for name in list(team.services):
            team.kill(name)
        subprocess.run(
            [sys.executable, str(REPO / "deploy" / "local_postgres.py"), "stop", str(pg_data)],
            capture_output=True,
            check=False,
            timeout=START_TIMEOUT_S,
        )
        shutil.rmtree(pg_data.parent, ignore_errors=True)


def test_credentials_come_from_the_environment() -> None:
    config = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
    limits = config["run_coordinator"]["config"]["tag_concurrency_limits"]
    assert {
        "key": "dagster/partition",
        "value": {"applyLimitPerUniqueValue": True},
        "limit": 1,
    } in limits


def test_every_service_listens_on_loopback_only(team: Team) -> None:
    for name, process in team.services.items():
        assert _listening(process.pid) <= {"127.0.0.1"}, name
    assert _listening(team.services["webserver"].pid) == {"127.0.0.1"}
    postgres = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "postgres" and str(team.pg_data) in " ".join(p.info["cmdline"] or [])
    ]
    assert postgres and set().union(*(_listening(p.pid) for p in postgres)) == {"127.0.0.1"}


def test_the_sensor_registers_steps_and_the_queue_runs_them_within_the_limit(team: Team) -> None:
    team.dagster("sensor", "start", "rollout_steps_sensor", "-w", "deploy/workspace.yaml")
    records = _wait(
        "the sensor's runs of every step finish",
        lambda: (
            (r := [x for x in team.runs() if x.dagster_run.status in TERMINAL])
            and len(r) >= len(STEPS)
            and r
        ),
        team,
    )
    instance = team.instance()
    keys = instance.get_dynamic_partitions("rollout_steps")
    enqueued = {
        r.dagster_run.run_id
        for r in records
        if instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED)
    }
    assert sorted(keys) == [partition_key(s) for s in STEPS]
    assert {r.dagster_run.status for r in records} == {dg.DagsterRunStatus.SUCCESS}
    assert {r.dagster_run.tags["dagster/partition"] for r in records} == set(keys)
    assert enqueued == {r.dagster_run.run_id for r in records}
    assert most_at_once(_spans(records)) <= MAX_RUNS
    for step in STEPS:
        assert (team.output / f"step={step}" / MANIFEST).is_file()
    team.dagster("sensor", "stop", "rollout_steps_sensor", "-w", "deploy/workspace.yaml")


def test_two_runs_of_one_step_never_overlap(team: Team) -> None:
    run_ids = {_launch(team, 1), _launch(team, 1), _launch(team, 2)}
    records = _wait("three launched runs finish", lambda: _finished(team, run_ids), team)
    assert {r.dagster_run.status for r in records} == {dg.DagsterRunStatus.SUCCESS}
    step_1 = [r for r in records if r.dagster_run.tags["dagster/partition"] == partition_key(1)]
    assert len(step_1) == 2
    assert most_at_once(_spans(step_1)) == 1


def test_a_killed_daemon_restarts_and_drains_the_queue(team: Team) -> None:
    run_ids = {_launch(team, step) for step in STEPS}

    def one_started_and_one_waiting() -> bool:
        statuses = [r.dagster_run.status for r in team.runs() if r.dagster_run.run_id in run_ids]
        return dg.DagsterRunStatus.QUEUED in statuses and any(
            s in {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED} for s in statuses
        )

    _wait("a run started while others wait in the queue", one_started_and_one_waiting, team)
    team.kill("daemon", signal.SIGKILL)
    queued = {
        r.dagster_run.run_id
        for r in team.runs()
        if r.dagster_run.run_id in run_ids and r.dagster_run.status == dg.DagsterRunStatus.QUEUED
    }
    assert queued
    time.sleep(5 * POLL_S)
    still = {
        r.dagster_run.run_id
        for r in team.runs()
        if r.dagster_run.status == dg.DagsterRunStatus.QUEUED
    }
    assert queued <= still, "runs left the queue with no daemon"
    team.start("daemon")
    records = _wait("the restarted daemon drains the queue", lambda: _drained(team, run_ids), team)
    # every step built by one of its runs: the one launched, or its retry where the killed
    # daemon left it starting with no process (failed by the run monitor, then retried)
    built = {
        r.dagster_run.tags["dagster/partition"]
        for r in records
        if r.dagster_run.status == dg.DagsterRunStatus.SUCCESS
    }
    assert built == {partition_key(step) for step in STEPS}
    for record in records:
        if record.dagster_run.status != dg.DagsterRunStatus.SUCCESS:
            assert record.dagster_run.run_id in run_ids  # a retry never failed
    assert most_at_once(_spans(records)) <= MAX_RUNS


def _drained(team: Team, run_ids: set[str]) -> list[dg.RunRecord] | None:
    """The launched runs and their retries, once none of them is queued or running and
    every failed one has its retry."""
    records = [
        r
        for r in team.runs()
        if r.dagster_run.run_id in run_ids or r.dagster_run.tags.get(ROOT_RUN) in run_ids
    ]
    retried = {r.dagster_run.tags.get(ROOT_RUN) for r in records}
    if any(r.dagster_run.status not in TERMINAL for r in records):
        return None
    failed = {
        r.dagster_run.run_id
        for r in records
        if r.dagster_run.run_id in run_ids and r.dagster_run.status != dg.DagsterRunStatus.SUCCESS
    }
    return records if failed <= retried else None


def test_the_schedule_rebuilds_a_missing_step(team: Team) -> None:
    before = {r.dagster_run.run_id for r in team.runs()}
    shutil.rmtree(team.output / "step=3")
    team.dagster("schedule", "start", "stale_shards_schedule", "-w", "deploy/workspace.yaml")

    def rebuilt() -> list[dg.RunRecord] | None:
        new = [r for r in team.runs() if r.dagster_run.run_id not in before]
        done = [r for r in new if r.dagster_run.status in TERMINAL]
        return done if done and len(done) == len(new) else None

    records = _wait("the schedule's run of the missing step finishes", rebuilt, team)
    team.dagster("schedule", "stop", "stale_shards_schedule", "-w", "deploy/workspace.yaml")
    assert [(r.dagster_run.tags["dagster/partition"], r.dagster_run.status) for r in records] == [
        (partition_key(3), dg.DagsterRunStatus.SUCCESS)
    ]
    assert records[0].dagster_run.tags[REASON_TAG] == MISSING
    assert (team.output / "step=3" / MANIFEST).is_file()


def test_the_history_outlives_a_webserver_restart(team: Team) -> None:
    def listed() -> set[str]:
        results = team.graphql(RUN_IDS)["runsOrError"]["results"]
        return {r["runId"] for r in results}

    before = listed()
    assert len(before) >= len(STEPS) + 3 + len(STEPS)
    team.kill("webserver")
    team.start("webserver")
    _wait(
        "the restarted webserver loads the code location",
        lambda: _webserver_loaded(team),
        team,
        START_TIMEOUT_S,
    )
    assert listed() == before
