"""The bad-input corpus (bad_inputs/generate.py) through the command each case names, as a
user runs it: exit 1 with one readable line per broken rule naming step, file, rule and
rows, no traceback and no step folder; exit 2 with one usage-error line; or, where the
input is acceptable or quarantined, the exact manifest counts and quarantine table.
`build` runs most cases; `validate` and `parity` run theirs with the exact lines (or the
strict JSON report) expected, and `stage` runs the Dagster stages' staging on a `.staging`
linked elsewhere (the CLI never stages). A refused case changes nothing in its folder.

The CLI cases run through `pipeline.cli.main` in this process (stdout and stderr
captured); every twentieth runs as a real subprocess too, so the command line itself is
covered; `stage` cases always run as a `python -c` subprocess."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import printable
from tests.core.bad_inputs.generate import ARGS, HOST, STEP, cases, generate
from tests.support.cli import Result, in_process
from tests.support.samples import REPO

GENERATOR = Path(__file__).with_name("bad_inputs") / "generate.py"
NAMES = [case.name for case in cases()]
PROG = "rollout-shards"
PREFIX = f"{PROG}: build: "
USAGE = f"{PROG}: usage error: "
# The prefix of a refused case's lines: `stage` prints the lines of the Dagster failure,
# which are `build`'s.
PREFIXES = {
    "build": PREFIX,
    "validate": f"{PROG}: validate: ",
    "parity": f"{PROG}: parity: ",
    "metrics": f"{PROG}: metrics: ",
    "stage": PREFIX,
}
# The Dagster assets' entry to a step's stages (pipeline.orchestration.compute runs it in
# process, the Pipes worker in its own): the failure's description is the CLI's lines
# (pipeline.orchestration.reporting), printed here with the CLI's exit status.
STAGE_ENTRY = """
import json, sys
from pathlib import Path
from pipeline.errors import StepError, UsageError, error_lines
from pipeline.settings import load_settings
from pipeline.step.roots import StepRoots
from pipeline.step.stages import run_stages
inputs, out, stages, step, settings = sys.argv[1:]
roots = StepRoots(Path(inputs), Path(out))
try:
    for _ in run_stages(stages.split(","), roots, int(step), load_settings(**json.loads(settings))):
        pass
except (StepError, UsageError) as exc:
    print("\\n".join(error_lines("build", exc)), file=sys.stderr)
    sys.exit(2 if isinstance(exc, UsageError) else 1)
"""


SUBPROCESS = set(NAMES[::20])


def _placed(text: str, folder: Path) -> str:
    return text.replace("{input}", str(folder / "input")).replace("{case}", str(folder))


def _placed_json(value: Any, folder: Path) -> Any:
    if isinstance(value, str):
        return _placed(value, folder)
    if isinstance(value, list):
        return [_placed_json(v, folder) for v in value]
    if isinstance(value, dict):
        return {k: _placed_json(v, folder) for k, v in value.items()}
    return value


def argv(folder: Path) -> list[str]:
    """The command line of a case (for `stage`, the arguments of STAGE_ENTRY)."""
    spec = json.loads((folder / "case.json").read_text())
    args = [_placed(a, folder) for a in spec["args"]]
    inputs, out = str(folder / "input"), str(folder / "out")
    return {
        "build": ["build", inputs, "--out", out, *args],
        "validate": ["validate", inputs, *args],
        "parity": ["parity", *args],
        "metrics": ["metrics", *args],
        "stage": [inputs, out, *args],
    }[spec["command"]]


def build(folder: Path) -> Result:
    return in_process(argv(folder))


def build_subprocess(folder: Path) -> Result:
    spec = json.loads((folder / "case.json").read_text())
    if spec["command"] == "stage":
        command = [sys.executable, "-c", STAGE_ENTRY, *argv(folder)]
    else:
        command = [sys.executable, "-m", "pipeline.cli", *argv(folder)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    return Result(done.returncode, done.stdout, done.stderr)


def prepare(folder: Path, steps: list[dict[str, Any]]) -> None:
    """What a case asks for before its command (see generate.py): a build, then
    corruptions of it."""
    for step in steps:
        ((op, value),) = step.items()
        if op == "build":
            built = in_process(
                ["build", str(folder / "input"), "--out", str(folder / value), *ARGS]
            )
            assert built.returncode == 0, built.stderr
        elif op == "copy":
            source, target = folder / value[0], folder / value[1]
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copyfile(source, target)
        elif op == "fifo":
            (folder / value).unlink()
            os.mkfifo(folder / value)
        elif op == "link":
            (folder / value[0]).unlink()
            os.symlink(value[1], folder / value[0])
        elif op == "replace":
            path, old, new = folder / value[0], value[1], value[2]
            text = path.read_text()
            assert text.count(old) == 1, (path, old)
            path.write_text(text.replace(old, new))
        else:
            assert op == "write", op
            (folder / value[0]).write_bytes(bytes.fromhex(value[1]))


# Left aside when a refused case is compared with its folder before the command: the step
# locks, the output root's dataset card (it names no step; a build whose step folder
# cannot be replaced has written it already), and the records of refused steps
# (tests/core/test_refused.py checks them).
NOT_THE_STEPS = ("out/.locks", "out/README.md", "out/_refused")


def snapshot(folder: Path) -> dict[str, tuple[str, str]]:
    """Every entry under a case folder, kind and content (a file's sha256, a link's
    target), without following links or opening FIFOs; NOT_THE_STEPS left aside."""
    found: dict[str, tuple[str, str]] = {}
    for parent, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(parent) / name
            key = str(path.relative_to(folder))
            mode = path.lstat().st_mode
            if key.startswith(NOT_THE_STEPS) or (key == "out" and stat.S_ISDIR(mode)):
                continue  # the root itself: what it holds is compared
            if stat.S_ISLNK(mode):
                found[key] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                found[key] = ("dir" if stat.S_ISDIR(mode) else "other", "")
    return found


@dataclass
class Ran:
    folder: Path
    result: Result
    before: dict[str, tuple[str, str]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every case generated by the script, prepared and run once."""
    root = tmp_path_factory.mktemp("bad_inputs")
    subprocess.run([sys.executable, str(GENERATOR), str(root)], check=True, cwd=REPO)
    ran = {}
    for name in NAMES:
        folder = root / name
        spec = json.loads((folder / "case.json").read_text())
        prepare(folder, spec["prepare"])
        before = snapshot(folder)
        stage = spec["command"] == "stage"
        run = build_subprocess if name in SUBPROCESS or stage else build
        if spec["stdout"] is not None or spec["signal"] is not None:
            run = as_program
        ran[name] = Ran(folder, run(folder), before)
    return ran


def as_program(folder: Path) -> Result:
    """The command as a program whose stdout is closed (`>&-`) or read for one line and
    then closed (`| head -1`), or that gets a signal while it waits for step 7's lock."""
    spec = json.loads((folder / "case.json").read_text())
    command = [sys.executable, "-m", "pipeline.cli", *argv(folder)]
    if spec["stdout"] == "closed":
        closed = ["sh", "-c", 'exec "$@" >&-', "sh", *command]
        done = subprocess.run(closed, stderr=subprocess.PIPE, text=True, cwd=REPO, check=False)
        return Result(done.returncode, "", done.stderr)
    if spec["stdout"] == "broken":
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read()
        return Result(process.wait(timeout=120), first, stderr)
    (folder / "out" / ".locks").mkdir(exist_ok=True)
    with open(folder / "out" / ".locks" / f"step={STEP}.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        _wait_for_the_lock(process.pid)
        process.send_signal(getattr(signal, spec["signal"]))
        stdout, stderr = process.communicate(timeout=120)
    return Result(process.returncode, stdout, stderr)


def _wait_for_the_lock(pid: int) -> None:
    """Until process `pid` waits for a lock (its request shows in /proc/locks as `->`)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if "->" in fields and fields[fields.index("->") + 4] == str(pid):
                    return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never waited for the step's lock")


def test_the_corpus_has_at_least_90_cases_and_covers_the_issues() -> None:
    assert len(NAMES) >= 90
    assert len(set(NAMES)) == len(NAMES)
    rules = {e["rule"] for case in cases() for e in case.errors}
    assert {
        "column_type",
        "missing_column",
        "unreadable_file",
        "step_matches_path",
        "unique_leaf",
        "reward_finite",
        "rollout_id_only_on_v2_multi_leaf",
        "rollout_id_shared_by_siblings",
        "rollout_key_unique_per_trajectory",
        "rollout_shares_reward",
        "one_session_version",
        "multi_leaf_only_in_v2",
        "identical_input_files",
        "duplicate_key",
        "raw_reward_finite",
        "log_probs_finite",
        "not_enough_samples_for_dp_size",
        "ambiguous_step_path",
        "step_out_of_range",
        "output_not_a_folder",
    } <= rules
    assert {0, 1, 2} <= {case.exit for case in cases()}
    assert {case.command for case in cases()} == set(PREFIXES)
    assert any(case.report is not None for case in cases() if case.command == "validate")
    assert SUBPROCESS and SUBPROCESS < set(NAMES)


def test_the_generator_is_deterministic(tmp_path: Path) -> None:
    def digest(root: Path) -> dict[str, str]:
        generate(root)
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    assert digest(tmp_path / "a") == digest(tmp_path / "b")


def _rows_text(rows: list[list[Any]]) -> str:
    return "rows (index, leaf): " + ", ".join(f"({index}, {leaf})" for index, leaf in rows)


def _placed_host(path: Path) -> Path:
    return Path(str(path).replace("{host}", HOST))


def _check_built(ran: Ran, spec: dict[str, Any]) -> None:
    """A case run as a program: its exact stderr lines, and exactly the steps `built`
    committed (each whole: a manifest whose counts add up); interrupted, nothing else
    changed in its folder."""
    folder, result = ran.folder, ran.result
    assert result.stderr.splitlines() == [PREFIX + _placed(line, folder) for line in spec["lines"]]
    out = folder / "out"
    folders = sorted(p.name for p in out.glob("step=*")) if out.is_dir() else []
    assert folders == [f"step={step}" for step in spec["built"]], folders
    for step in spec["built"]:
        counts = json.loads((out / f"step={step}" / "manifest.json").read_text())["counts"]
        assert counts["ingested"] == counts["written"] == 8, counts
    if spec["signal"] is not None:
        assert result.stdout == ""
        assert snapshot(folder) == ran.before, "an interrupted build left something behind"


def _check_refused(folder: Path, spec: dict[str, Any], stderr: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == len(spec["errors"]), stderr
    for expected in spec["errors"]:
        matching = [line for line in lines if f"rule {expected['rule']}: " in line]
        assert len(matching) == 1, (expected["rule"], stderr)
        line = matching[0]
        where = f"step {expected['step']}: " if expected["step"] is not None else ""
        assert line.startswith(PREFIX + where), line
        if expected["step"] is None:
            assert not line.startswith(PREFIX + "step "), line
        for name in expected["files"]:
            assert printable(str(folder / "input" / name)) in line, line
        if expected["rows"]:
            more = expected.get("more", 0)
            tail = f" and {more} more" if more else ""
            assert line.endswith(_rows_text(expected["rows"]) + tail), line
        else:
            assert "rows (index, leaf)" not in line, line
        assert expected["text"] in line, line
    _check_nothing_written(folder)


def _check_nothing_written(folder: Path) -> None:
    out = folder / "out"
    written = [p for p in out.glob("step=*") if p.is_dir()] if out.is_dir() else []
    assert not written, "a step folder was written"
    inside = [p for p in (folder / "input").rglob("*") if p.name.startswith(("step=", "."))]
    assert not [p for p in inside if (p / "manifest.json").exists()], "shards in the input"


def _check_written(folder: Path, spec: dict[str, Any], stdout: str, stderr: str) -> None:
    step = folder / "out" / f"step={STEP}"
    manifest = json.loads((step / "manifest.json").read_text())
    # a build that quarantined says so: one line per rule, its rows and the quarantine file
    where = printable(str(folder / "out" / "_quarantine" / f"step={STEP}.parquet"))
    assert stderr.splitlines() == [
        f"{PROG}: build: step {STEP}: {k} row{'' if k == 1 else 's'} quarantined by {rule} "
        f"-> {where}"
        for rule, k in manifest["quarantined_rules"].items()
    ]
    assert sum(manifest["quarantined_rules"].values()) >= manifest["counts"]["quarantined"]
    outcome = spec["outcome"]
    n = manifest["counts"]
    assert n == outcome["counts"]
    assert n["ingested"] == n["quarantined"] + n["trimmed"] + n["dropped"] + n["written"]
    assert manifest["ignored_columns"] == outcome["ignored_columns"]
    skipped = [str(folder / "input" / name) for name in outcome.get("skipped_files", [])]
    assert manifest["skipped_files"] == skipped
    assert f"{n['quarantined']} quarantined" in stdout
    quarantine = step.parent / "_quarantine" / f"{step.name}.parquet"
    assert not (step / "quarantine.parquet").exists()
    if not outcome["quarantine"]:
        assert not quarantine.exists()
        return
    table = pl.read_parquet(quarantine)
    found = table.select("index", "leaf", "reason").rows()
    assert [list(row) for row in found] == outcome["quarantine"]
    assert table.columns[-3:] == ["source_file", "source_row", "reason"]
    written = (folder / "input").rglob("*.parquet")
    assert set().union(*(pl.read_parquet_schema(p) for p in written)) <= set(table.columns)
    outputs = {o["path"] for o in manifest["outputs"]}
    assert {f"../_quarantine/{step.name}.parquet", "rank=0.parquet"} <= outputs


def strict_loads(text: str) -> Any:
    """JSON as a strict parser reads it: a bare NaN or Infinity is no JSON."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def _check_lines_and_report(ran: Ran, spec: dict[str, Any]) -> None:
    """A case of another command than `build`: its exact lines, or the report it prints,
    and nothing changed in its folder when it is refused."""
    folder, result = ran.folder, ran.result
    prefix = USAGE if spec["exit"] == 2 else PREFIXES[spec["command"]]
    expected = [prefix + _placed(line, folder) for line in spec["lines"]]
    assert result.stderr.splitlines() == expected, result.stderr
    if spec["report"] is not None:
        assert strict_loads(result.stdout) == _placed_json(spec["report"], folder)
    elif spec["exit"] != 0:
        assert result.stdout == ""


@pytest.mark.parametrize("name", NAMES)
def test_case(corpus: dict[str, Ran], name: str) -> None:
    folder, result = corpus[name].folder, corpus[name].result
    spec = json.loads((folder / "case.json").read_text())
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == spec["exit"], result.stderr
    notes = [
        f"{PROG}: note: skipped {printable(str(folder / 'input' / name))}: "
        for name in spec["notes"]
    ]
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith(f"{PROG}: note: ")] == [
        line for note in notes for line in lines if line.startswith(note)
    ]
    assert len([line for line in lines if line.startswith(f"{PROG}: note: ")]) == len(notes)
    result.stderr = "".join(f"{line}\n" for line in lines if not line.startswith(f"{PROG}: note: "))
    for path in spec["kept"]:
        assert os.path.lexists(_placed_host(folder / path)), f"{path} was removed"
    for path in spec["gone"]:
        assert not os.path.lexists(_placed_host(folder / path)), f"{path} is still there"
    if spec["built"] is not None:
        _check_built(corpus[name], spec)
    elif spec["command"] != "build":
        _check_lines_and_report(corpus[name], spec)
    elif spec["exit"] == 0:
        _check_written(folder, spec, result.stdout, result.stderr)
    elif spec["exit"] == 2:
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"{PROG}: usage error: "), result.stderr
        assert spec["usage"] in result.stderr, result.stderr
        _check_nothing_written(folder)
    else:
        # Nothing on stdout: no summary of a written step, no progress (not a terminal).
        assert result.stdout == "", result.stdout
        _check_refused(folder, spec, result.stderr)
    if spec["exit"] != 0 and spec["built"] is None:
        assert snapshot(folder) == corpus[name].before, "a refused case wrote or changed something"


def test_accepted_json_values_are_kept_as_json_text(corpus: dict[str, Ran]) -> None:
    folder = corpus["chat_prompt_and_dict_metadata"].folder
    shard = pl.read_parquet(folder / "out" / f"step={STEP}" / "rank=0.parquet")
    assert set(shard.get_column("metadata")) == {'{"source":"gsm8k"}'}


def test_a_quarantined_value_keeps_its_file_and_row(corpus: dict[str, Ran]) -> None:
    folder = corpus["quarantine_a_value_of_the_wrong_type"].folder
    table = pl.read_parquet(folder / "out" / "_quarantine" / f"step={STEP}.parquet")
    table = table.filter(pl.col("index") == 5)  # its prompt group's other rows are there too
    assert table.select("source_file", "source_row", "reward").rows() == [
        (str(folder / "input" / f"step={STEP}.jsonl"), 5, None)
    ]
