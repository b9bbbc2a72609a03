"""The rank-bounded build (`pipeline.step.readers.spill`): the same bytes as the in-memory build
for every layout and kind of input, the in-memory build's exact report for a step it
cannot vouch for, and no spill left behind."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline import speed
from pipeline.errors import StepError
from pipeline.io import writer
from pipeline.io.discovery import SourceFile, find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from pipeline.step.readers import spill
from pipeline.step.readers.memory import MemoryReader
from tests.support.layouts import (
    LAYOUTS,
    THREE_FILES,
    cases,
    mixed_files,
    step_column_files,
    three_files_one_without_loss_mask,
)
from tests.support.samples import generated_step

# 256 KiB per part: every generated step (7 MB of Parquet) comes in about thirty parts.
SMALL_PARTS = 256 << 10


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each read of a step, "memory" or "spill" (the driver reads a step once, one way),
    the spill's parts small."""
    reads: list[str] = []
    for name, reader in (("memory", MemoryReader), ("spill", spill.SpillReader)):
        read = reader.read

        def recorded(self: Any, job: Any, name: str = name, read: Any = read) -> Any:
            reads.append(name)
            return read(self, job)

        monkeypatch.setattr(reader, "read", recorded)
    monkeypatch.setattr(spill, "PART_BYTES", SMALL_PARTS)
    yield reads


def _sources(folder: Path) -> dict[int, list[SourceFile]]:
    return group_steps(find_sources([folder]))


def _build_both(
    folder: Path, out: Path, settings: Settings
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Every file of every step built in memory and bounded, by name."""
    results = []
    for name, above in (("memory", None), ("bounded", 0)):
        root = out / name
        for step, files in _sources(folder).items():
            build_step(step, files, settings.replace(stream_above=above), root)
        results.append(
            {
                str(path.relative_to(root)): path.read_bytes()
                for path in sorted(root.rglob("*"))
                if path.is_file() and ".locks" not in path.parts
            }
        )
    return results[0], results[1]


def _one_file(folder: Path) -> Path:
    return generated_step(folder)


INPUTS: dict[str, Callable[[Path], Path]] = {
    "one file": _one_file,
    THREE_FILES: three_files_one_without_loss_mask,
    "parquet and json lines": lambda folder: mixed_files(folder, ("parquet", "ndjson")),
    "files named without a step": step_column_files,
}
SETTINGS = {name: LAYOUTS[name] for name in ("strided", "balanced", "cp schedule", "no trimming")}
CASES = cases("one file", list(INPUTS), list(SETTINGS))


@pytest.mark.parametrize(("inputs", "settings"), CASES)
def test_same_bytes_as_in_memory(
    inputs: str, settings: str, tmp_path: Path, streamed: list[str]
) -> None:
    folder = INPUTS[inputs](tmp_path / "in")
    memory, spilled = _build_both(folder, tmp_path / "out", Settings(**SETTINGS[settings]))
    assert streamed and streamed.count("memory") == streamed.count("spill") == len(streamed) // 2
    assert sorted(memory) == sorted(spilled)
    assert [name for name in memory if memory[name] != spilled[name]] == []
    assert any(name.endswith("rank=1.parquet") for name in memory)


def test_non_compact_step_is_trimmed_alike(tmp_path: Path, streamed: list[str]) -> None:
    folder = generated_step(tmp_path / "in", non_compact=True)
    settings = Settings(global_batch_size=64, dp_size=4)
    memory, spilled = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert memory == spilled
    manifest = json.loads(memory["step=0/manifest.json"])
    assert manifest["counts"]["trimmed"] > 0


@pytest.mark.parametrize("two_from", [0, 1 << 60])
def test_ranks_written_two_at_once_or_one_alike(
    two_from: int, tmp_path: Path, streamed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big ranks are written two at once (`BigSpilledRows`), small ones one at a time: the
    same bytes as in memory either way."""
    chosen: list[str] = []
    made = spill.spilled

    def spilled(batch: Any, kept: spill.Spill) -> Any:
        planned = made(batch, kept)
        chosen.append(type(planned.rank_rows).__name__)
        return planned

    monkeypatch.setattr(spill, "TWO_RANKS_FROM", two_from)
    monkeypatch.setattr(spill, "spilled", spilled)
    folder = generated_step(tmp_path / "in", non_compact=True)
    settings = Settings(global_batch_size=64, dp_size=4)
    memory, bounded = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert chosen == ["BigSpilledRows" if two_from == 0 else "SpilledRows"]
    assert memory == bounded


def _changed_step(tmp_path: Path, column: str, value: pl.Expr) -> Path:
    """A folder holding the generated step with `column` set to `value`."""
    table = pl.read_parquet(generated_step(tmp_path / "gen") / "step=0.parquet")
    folder = tmp_path / "in"
    folder.mkdir()
    table.with_columns(value.alias(column)).write_parquet(folder / "step=0.parquet")
    return folder


def test_repaired_ids_alike(tmp_path: Path, streamed: list[str]) -> None:
    """Legacy ids (set on v1 rows) are cleared by the repair policy on either path."""
    legacy = pl.when(pl.col("session_version") == "v1").then(pl.col("index"))
    folder = _changed_step(tmp_path, "rollout_id", legacy.otherwise(pl.col("rollout_id")))
    settings = Settings(global_batch_size=64, dp_size=4, rollout_id_policy="repair")
    memory, spilled = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert memory == spilled
    assert json.loads(memory["step=0/manifest.json"])["counts"]["repaired"] > 0


def _refusal(folder: Path, root: Path, settings: Settings, above: int | None) -> str:
    (step, files), *_ = _sources(folder).items()
    with pytest.raises(StepError) as caught:
        build_step(step, files, settings.replace(stream_above=above), root)
    return str(caught.value)


def test_a_value_of_another_type_in_a_later_part_is_reported_as_in_memory(
    tmp_path: Path, streamed: list[str]
) -> None:
    table = pl.read_parquet(generated_step(tmp_path / "gen") / "step=0.parquet")
    bad = table.with_columns(
        pl.when(pl.int_range(pl.len()) == table.height - 5)
        .then(pl.lit("7"))
        .otherwise(pl.col("response_length").cast(pl.String))
        .alias("response_length")
    )
    folder = tmp_path / "in"
    folder.mkdir()
    bad.write_parquet(folder / "step=0.parquet")
    settings = Settings(global_batch_size=64, dp_size=4)
    memory = _refusal(folder, tmp_path / "memory", settings, None)
    spilled = _refusal(folder, tmp_path / "bounded", settings, 0)
    # each build read the step once: in memory, then in parts
    assert streamed == ["memory", "spill"]
    assert spilled == memory and "column_type" in memory
    # nothing of the step written, no spill left: the root holds the refusal record alone
    # (docs/contract.md, section 5), the same for both reads but its time
    left = sorted(
        str(p.relative_to(tmp_path / "bounded")) for p in (tmp_path / "bounded").rglob("*")
    )
    assert left == [".locks", ".locks/step=0.lock", "_refused", "_refused/step=0.json"]
    records = [
        json.loads((tmp_path / root / "_refused" / "step=0.json").read_text())
        for root in ("memory", "bounded")
    ]
    for record in records:
        assert record.pop("refused_at") and record.pop("shown_by")
    assert records[0] == records[1] and records[0]["violations"][0]["rule"] == "column_type"


BREAKS = {
    "a row rule": pl.col("response_length") + 100_000,  # longer than its tokens
    "a column test": pl.lit(-1, dtype=pl.Int32),  # response_length >= 0
}


@pytest.mark.parametrize("rule", BREAKS)
def test_quarantined_trajectories_as_in_memory(
    rule: str, tmp_path: Path, streamed: list[str]
) -> None:
    """Trajectories set aside read their lists back from the spill: the same rank files,
    quarantine table and manifest as the in-memory build."""
    broken = pl.when(pl.int_range(pl.len()).is_in([100, 2500])).then(BREAKS[rule])
    folder = _changed_step(tmp_path, "response_length", broken.otherwise(pl.col("response_length")))
    settings = Settings(global_batch_size=64, dp_size=4, on_invalid="quarantine")
    memory, spilled = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert sorted(memory) == sorted(spilled)
    assert [name for name in memory if memory[name] != spilled[name]] == []
    assert "_quarantine/step=0.parquet" in memory


def test_a_rule_broken_without_quarantine_is_reported_as_in_memory(
    tmp_path: Path, streamed: list[str]
) -> None:
    table = pl.read_parquet(generated_step(tmp_path / "gen") / "step=0.parquet")
    folder = tmp_path / "in"
    folder.mkdir()
    table.with_columns(pl.col("response_length") + 100_000).write_parquet(folder / "step=0.parquet")
    settings = Settings(global_batch_size=64, dp_size=4)
    memory = _refusal(folder, tmp_path / "memory", settings, None)
    spilled = _refusal(folder, tmp_path / "bounded", settings, 0)
    assert streamed == ["memory", "spill"]
    assert spilled == memory and "response_within_tokens" in memory


def test_ranks_written_two_at_once_gather_one_at_a_time(
    tmp_path: Path, streamed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks are written at once, but one gathers its lists while the other is encoded:
    both gathering would hold both ranks' lists twice at the same moment."""
    active, most = [0], [0]

    def counted(take: Callable[..., Any]) -> Callable[..., Any]:
        def taking(*args: Any) -> Any:
            active[0] += 1
            most[0] = max(most[0], active[0])
            time.sleep(0.05)  # a second writer gathering meanwhile would be seen
            try:
                return take(*args)
            finally:
                active[0] -= 1

        return taking

    monkeypatch.setattr(spill, "TWO_RANKS_FROM", 0)
    # rows in spill order are taken by row group, others taken whole and gathered
    monkeypatch.setattr(spill, "take_groups", counted(spill.take_groups))
    monkeypatch.setattr(spill, "take_rows", counted(spill.take_rows))
    folder = generated_step(tmp_path / "in", non_compact=True)
    settings = Settings(global_batch_size=64, dp_size=4)
    memory, bounded = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert most == [1]
    assert memory == bounded


@pytest.mark.parametrize(
    ("layout", "taken_by"), [("strided", "take_groups"), ("cp schedule", "take_rows")]
)
def test_ranks_of_several_row_groups_from_several_spill_files_as_in_memory(
    layout: str,
    taken_by: str,
    tmp_path: Path,
    streamed: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Polars sizes a row group's pages by the buffers it is cut from: a rank of several
    row groups whose rows come from several spill files has the in-memory build's bytes
    only if each row group's lists are written from buffers of their own, as the in-memory
    build's are, a group across two spill files included. Rows in spill order are taken
    group by group (`take_groups`); rows a schedule reorders are taken whole and gathered
    by group (`take_rows`)."""
    calls: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        take = getattr(spill, name)
        return lambda *args: (calls.append(name), take(*args))[1]

    for name in ("take_groups", "take_rows"):
        monkeypatch.setattr(spill, name, counted(name))
    monkeypatch.setattr(spill, "FILE_BYTES", 1)  # a spill file per part
    folder = generated_step(tmp_path / "in", non_compact=True)
    settings = Settings(**{**LAYOUTS[layout], "dp_size": 2})
    memory, bounded = _build_both(folder, tmp_path / "out", settings)
    assert streamed == ["memory", "spill"]
    assert set(calls) == {taken_by}
    rank = "step=0/rank=0.parquet"
    assert pl.read_parquet(memory[rank]).height > 1024  # more than one row group
    assert [name for name in memory if memory[name] != bounded[name]] == []


def test_no_spill_is_left_and_a_killed_builds_is_removed(
    tmp_path: Path, streamed: list[str]
) -> None:
    folder = generated_step(tmp_path / "in")
    root = tmp_path / "out"
    root.mkdir()
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"
    dead = root / f".tmp-spill-step=0-{host}-{2**22 + 7}-0123abcd"
    dead.mkdir()
    (dead / "part=0.arrow").write_bytes(b"left by a killed build")
    (step, files), *_ = _sources(folder).items()
    build_step(step, files, Settings(global_batch_size=64, dp_size=4, stream_above=0), root)
    assert streamed == ["spill"]
    assert sorted(p.name for p in root.iterdir()) == [".locks", "README.md", "step=0"]


def test_the_spill_files_are_removed_while_the_last_ranks_are_written(
    tmp_path: Path, streamed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, list[str]]] = []
    all_taken = spill.Spill.all_taken

    def told(self: spill.Spill) -> None:
        events.append(("all taken", sorted(p.name for p in self.folder.iterdir())))
        all_taken(self)
        assert self._remover is not None
        self._remover.shutdown()  # the removal done
        events.append(("removed", sorted(p.name for p in self.folder.iterdir())))

    write = writer.write_parquet

    def written(frame: pl.DataFrame, path: Path) -> None:
        events.append(("write", [path.name]))
        write(frame, path)

    monkeypatch.setattr(spill.Spill, "all_taken", told)
    monkeypatch.setattr(writer, "write_parquet", written)
    folder = generated_step(tmp_path / "in")
    (step, files), *_ = _sources(folder).items()
    settings = Settings(global_batch_size=64, dp_size=4, stream_above=0)
    memory = build_step(step, files, settings.replace(stream_above=None), tmp_path / "memory")
    events.clear()
    bounded = build_step(step, files, settings, tmp_path / "out")
    assert streamed == ["memory", "spill"]
    kinds = [kind for kind, _ in events]
    assert kinds.count("all taken") == kinds.count("removed") == 1
    taken = kinds.index("all taken")
    assert events[taken][1] and all(n.startswith("part=") for n in events[taken][1])
    assert events[taken + 1] == ("removed", [])
    assert 0 < kinds[:taken].count("write") < 4 and kinds[taken:].count("write") >= 1
    assert [o.sha256 for o in bounded.outputs] == [o.sha256 for o in memory.outputs]


def test_the_threshold_is_the_inputs_size_on_disk(tmp_path: Path, streamed: list[str]) -> None:
    folder = generated_step(tmp_path / "in")
    size = os.stat(folder / "step=0.parquet").st_size
    (step, files), *_ = _sources(folder).items()
    settings = Settings(global_batch_size=64, dp_size=4)
    # stream_above is in MiB: a step above it is streamed, one at or below it is not
    at_or_above = settings.replace(stream_above=-(-size // 2**20))
    build_step(step, files, at_or_above, tmp_path / "a")
    assert streamed == ["memory"]
    build_step(step, files, settings.replace(stream_above=size // 2**20), tmp_path / "b")
    assert streamed == ["memory", "spill"]


LISTS = pl.DataFrame(
    {
        "tokens": [[1, 2, 3], [], None, list(range(5000))],
        "loss_mask": [[1, 0, 1], [], [1], [0] * 5000],
        "rollout_log_probs": [[-0.5, -1.25, 0.0], None, [], [-2.5] * 5000],
    },
    schema={
        "tokens": pl.List(pl.Int32),
        "loss_mask": pl.List(pl.Int8),
        "rollout_log_probs": pl.List(pl.Float32),
    },
)


def test_the_spill_in_small_writes_reads_back_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts spilled in writes of at most `SMALL_WRITE` bytes, each of which the OS may take
    only in part, are the parts' lists again when a rank takes its rows back."""
    calls: list[int] = []
    write = os.write

    def short(fd: int, data: Any) -> int:  # the OS takes at most 100 bytes of a write
        calls.append(len(data))
        return write(fd, data[:100])

    monkeypatch.setattr(os, "write", short)
    with spill.Spill(tmp_path, 0) as kept:
        kept.add(LISTS)
        kept.add(LISTS.reverse())
        kept.close()
        monkeypatch.undo()
        ((path, first, rows),) = kept.parts  # one file of both parts
        assert (first, rows) == (0, 2 * LISTS.height)
        assert max(calls) <= speed.SMALL_WRITE and len(calls) > path.stat().st_size // 100
        taken = kept.take(pl.Series([0, 2, LISTS.height + 1]))
        assert pl.DataFrame(taken).equals(pl.concat([LISTS, LISTS.reverse()])[[0, 2, 5]])
        assert pl.read_ipc(path).equals(pl.concat([LISTS, LISTS.reverse()]))


def test_parts_share_a_file_up_to_its_size_and_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "FILE_BYTES", LISTS.to_arrow().nbytes * 2)
    other = LISTS.drop(LISTS.columns[-1])  # a file of the step without one list column
    with spill.Spill(tmp_path, 0) as kept:
        for lists in (LISTS, LISTS, LISTS, other, other):
            kept.add(lists)
        kept.close()
        height = LISTS.height
        assert [(first, rows) for _, first, rows in kept.parts] == [
            (0, 2 * height),
            (2 * height, height),
            (3 * height, 2 * height),
        ]
        taken = pl.DataFrame(kept.take(pl.Series([1, 3 * height])))
    assert taken.columns == LISTS.columns
    assert taken.row(0) == LISTS.row(1)
    assert taken.row(1) == (*other.row(0), None)


def test_a_spill_to_a_full_disk_is_the_os_error() -> None:
    """/dev/full fails every write with ENOSPC, as a full disk does: the spill raises the
    OSError the command line turns into its one line."""
    with pytest.raises(OSError) as raised:
        spilled = spill.SpillFile(Path("/dev/full"), LISTS.to_arrow().schema)
        try:
            spilled.write(LISTS.to_arrow())
        finally:
            spilled.close()
    assert raised.value.errno == errno.ENOSPC
