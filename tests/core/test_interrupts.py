"""A Ctrl-C at any point of a build read in parts (a spill) or in shares leaves the output
root as it was; one that comes while the step is being published waits for the commit, and
the root then holds the new step whole. The build is the program itself (`python -m`-like:
`main()` without arguments, so SIGINT gets the program's handler), sent SIGINT by its own
process on the chosen call of one function (a part spilled, a share read, a rank written,
the commit, ...). The step locks (`.locks`) are how builds take turns and are left aside.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tests.support.samples import REPO, entries, generated_step

# The program, with `module.function`'s `call`-th call sending SIGINT to the process first;
# parts of 64 KiB; the shares reader routed in for every step as `--ray` would route it.
ENTRY = """
import importlib, os, signal, sys
from contextlib import contextmanager
where, call, reader = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module_name, _, name = where.rpartition(".")
owner_name, _, attribute = name.partition(":")
module = importlib.import_module(module_name)
owner = getattr(module, owner_name) if attribute else module
attribute = attribute or owner_name
real = getattr(owner, attribute)
calls = [0]
def interrupting(*args, **kwargs):
    calls[0] += 1
    if calls[0] == call:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
setattr(owner, attribute, interrupting)
if reader == "spill":
    from pipeline.step.readers import spill
    spill.PART_BYTES = 64 << 10
if reader == "shares":
    from pipeline import commands
    from pipeline.step.readers import shares
    shares.SHARE_BYTES = 1
    @contextmanager
    def routed(settings, in_ray_job=False):
        yield lambda job: shares.by_tasks(job, shares.LocalTasks())
    commands.ray_route = routed
sys.argv = ["rollout-shards", *sys.argv[4:]]
from pipeline.cli import main
main()
"""

FIRST = ["--on-invalid", "quarantine", "--global-batch-size", "64", "--dp-size", "4"]
AGAIN = ["--force", "--on-invalid", "quarantine", "--global-batch-size", "32", "--dp-size", "2"]

# (function, call): where the build is interrupted; "after" marks the commit, after which
# the root holds the new step whole.
SPILL_POINTS = [
    ("pipeline.step.readers.spill.Spill:add", 1, "before"),
    ("pipeline.step.readers.spill.Spill:add", 4, "before"),
    ("pipeline.step.build.check", 1, "before"),
    ("pipeline.step.build.plan_batch", 1, "before"),
    ("pipeline.step.readers.spill.take_rows", 1, "before"),  # the quarantine's lists
    ("pipeline.step.write._write_rank_file", 2, "before"),
    ("pipeline.io.writer.sealing", 2, "before"),  # a rank file sealed in the background
    ("pipeline.io.writer.seal", 1, "before"),  # the quarantine's
    ("pipeline.io.writer.write_text_atomically", 1, "after"),  # the card, in the commit
    ("pipeline.io.writer.commit_folder", 1, "after"),
]
SHARES_POINTS = [
    ("pipeline.step.readers.shares.read_share", 1, "before"),
    ("pipeline.step.readers.shares.read_share", 3, "before"),
    ("pipeline.step.readers.shares.file_digest", 1, "before"),
    ("pipeline.step.readers.shares.share_lists", 1, "before"),
    ("pipeline.step.write.write_rank", 2, "before"),
    ("pipeline.io.writer.commit_folder", 1, "after"),
]
POINTS = [("spill", *p) for p in SPILL_POINTS] + [("shares", *p) for p in SHARES_POINTS]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under the output root but the step locks: a file's sha256, a folder."""
    found = {}
    for key, path in entries(root):
        if not key.startswith(".locks"):
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "/"
    return found


def _build(where: str, call: int, reader: str, args: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", ENTRY, where, str(call), reader, "build", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, check=False)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, dict[str, str]]]:
    """The input (a step of 3000 rows in row groups of 500, one row breaking a rule), the
    output root as the first build left it, and the snapshots of the root before and after
    a whole second build."""
    base = tmp_path_factory.mktemp("interrupts")
    table = pl.read_parquet(generated_step(base / "gen") / "step=0.parquet")
    broken = pl.when(pl.int_range(pl.len()) == 100).then(pl.col("response_length") + 100_000)
    table = table.with_columns(broken.otherwise(pl.col("response_length")).alias("response_length"))
    inputs = base / "in"
    inputs.mkdir()
    pq.write_table(table.to_arrow(), inputs / "step=0.parquet", row_group_size=500)
    first = base / "first"
    done = _build(
        "pipeline.io.writer.seal", 0, "memory", [str(inputs), "--out", str(first), *FIRST]
    )
    assert done.returncode == 0, done.stderr
    out = base / "out"
    shutil.copytree(first, out)
    before = snapshot(out)
    again = _build("pipeline.io.writer.seal", 0, "memory", [str(inputs), "--out", str(out), *AGAIN])
    assert again.returncode == 0, again.stderr
    after = snapshot(out)
    shutil.rmtree(out)
    assert before != after and "_quarantine/step=0.parquet" in before
    return inputs, first, {"before": before, "after": after}


@pytest.mark.parametrize(("reader", "where", "call", "left"), POINTS)
def test_an_interrupt_leaves_the_root_as_it_was(
    reader: str,
    where: str,
    call: int,
    left: str,
    roots: tuple[Path, Path, dict[str, dict[str, str]]],
) -> None:
    inputs, first, snapshots = roots
    out = first.parent / "out"
    shutil.copytree(first, out)
    try:
        args = [str(inputs), "--out", str(out), *AGAIN]
        if reader == "spill":
            args += ["--stream-above", "0"]
        done = _build(where, call, reader, args)
        assert done.returncode == -signal.SIGINT, (done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        assert snapshot(out) == snapshots[left]
    finally:
        shutil.rmtree(out)
