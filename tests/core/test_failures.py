"""Failures outside the data, through `pipeline.cli.main` in process:
a full disk, a blocking check that fails on the staged folder, a step folder whose
manifest cannot be trusted, the same input given twice."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.cli import main
from pipeline.io import writer
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step import write
from pipeline.step.freshness import current_manifest
from tests.support.samples import REPO, only_refused, sample, write_step

GBS = ["--global-batch-size", "2"]


def build(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["build", *map(str, args), *GBS])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def step_input(rows_dir: Path) -> Path:
    write_step(rows_dir, [sample(i, reward=float(i % 2)) for i in range(4)])
    return rows_dir


def test_a_full_disk_is_one_line_and_writes_nothing(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "write_parquet", full)
    out = tmp_path / "shards"

    code, _, err = build(capsys, step_input, "--out", out)

    assert code == 1
    assert err == f"rollout-shards: build: step 1: rule os_error: no space left on {out}\n"
    # No step folder, no staged sibling and no dataset card (written last before a step
    # commits) left behind: the root this build made is gone with its step lock.
    assert not out.exists()


@pytest.mark.parametrize("write", [writer.write_parquet, writer.write_staged])
def test_a_real_full_disk_is_an_os_error_naming_the_file(write: Callable[..., Any]) -> None:
    """/dev/full fails every write with ENOSPC, as a full disk does: both writers raise the
    OSError the command line turns into its one line, not Polars' "Invalid thrift" or "File
    out of specification"."""
    frame = pl.DataFrame({"tokens": [list(range(1000))] * 100})

    with pytest.raises(OSError) as raised:
        write(frame, Path("/dev/full"))

    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == "/dev/full"


def test_a_full_disk_polars_does_not_name_is_an_os_error_too(tmp_path: Path) -> None:
    """A rank file small enough to sit in Polars' write buffer first fails in the Parquet
    footer, where Polars (2.1) loses the OS error ("Invalid thrift: transport error"):
    still an OSError naming the file, the command line's one line, never a traceback. The
    rows of a rank of the embedded step 1, cut at every length, cover both."""
    step = str(REPO / "data" / "rollouts" / "step=1.parquet")
    assert main(["build", step, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    frame = pl.read_parquet(tmp_path / "out" / "step=1" / "rank=0.parquet")
    for rows in range(1, frame.height + 1):
        with pytest.raises(OSError) as raised:
            writer.write_parquet(frame.head(rows), Path("/dev/full"))
        assert raised.value.filename == "/dev/full"
        assert raised.value.errno in (errno.ENOSPC, errno.EIO)


def test_a_dataset_card_that_does_not_fit_publishes_no_step(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """The output root's card is written before the step commits: when it fails (a full
    disk), the step is not published and the line names the card."""

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(writer, "write_text_atomically", full)
    out = tmp_path / "shards"

    code, _, err = build(capsys, step_input, "--out", out)

    assert code == 1
    assert err == (
        f"rollout-shards: build: step 1: rule os_error: no space left on {out / 'README.md'}\n"
    )
    assert not out.exists()  # the root this build made is gone with its step lock


def test_a_failing_blocking_check_leaves_the_previous_folder(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    out = tmp_path / "shards"
    assert build(capsys, step_input, "--out", out)[0] == 0
    before = contents(out / "step=1")
    monkeypatch.setattr(
        write, "blocking_problems", lambda *_, **__: [("rank=0.parquet", "rows differ")]
    )

    code, _, err = build(capsys, step_input, "--out", out, "--force")

    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("rollout-shards: build: step 1: rule shards_verified: ")
    assert "rank=0.parquet: rows differ" in err
    assert contents(out / "step=1") == before
    assert sorted(p.name for p in out.iterdir() if p.name != ".locks") == [
        "README.md",
        "_refused",  # the refusal a trainer waiting on the step is told of
        "step=1",
    ]


def _refused_on_two_ranks(
    capsys: pytest.CaptureFixture[str], step_input: Path, out: Path, recorded: bool = True
) -> str:
    """Build the step on two ranks; it must fail with one line on stderr and publish nothing
    (not even the root's dataset card) but the refusal's record, when it is `recorded` (a
    failure of the machine is none). Returns that line."""
    code, _, err = build(
        capsys, step_input, "--out", out, "--dp-size", "2", "--global-batch-size", "2"
    )
    assert code == 1
    assert err.count("\n") == 1
    assert only_refused(out, 1) if recorded else not out.exists()
    return err


def test_a_rank_file_that_does_not_read_back_is_not_published(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Each written rank file's footer is read back (on the thread that hashes it) before
    the step is published: a file cut short on its way to disk fails the step."""
    original = writer.write_parquet

    def cut_short(frame: pl.DataFrame, path: Path) -> None:
        original(frame, path)
        if path.name == "rank=1.parquet":
            with open(path, "r+b") as handle:
                handle.truncate(path.stat().st_size // 2)

    monkeypatch.setattr(writer, "write_parquet", cut_short)
    err = _refused_on_two_ranks(capsys, step_input, tmp_path / "shards")

    assert err.startswith("rollout-shards: build: step 1: rule shards_verified: ")
    assert "rank=1.parquet: does not read as Parquet" in err


def test_a_rank_file_that_cannot_be_made_durable_publishes_nothing(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """The thread that seals each rank file (its digest and fsync) reports a failing fsync
    as the build's one line, naming the file, and nothing of the step is published."""
    original = writer.sealing

    def failing(path: Path) -> Generator[None, None, str]:
        digest = yield from original(path)
        if path.name == "rank=1.parquet":  # its bytes hashed, its fsync failing
            raise OSError(errno.EIO, "Input/output error", str(path))
        return digest

    monkeypatch.setattr(writer, "sealing", failing)
    err = _refused_on_two_ranks(capsys, step_input, tmp_path / "shards", recorded=False)

    assert err.startswith("rollout-shards: build: step 1: rule os_error: Input/output error on ")
    assert err.rstrip().endswith("rank=1.parquet")


def _rewrite(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / "manifest.json"
        data = json.loads(path.read_text())
        path.write_text(json.dumps(change(data)))

    return apply


def _drop_input_key(key: str) -> Callable[[Path], None]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        for record in data["inputs"]:
            record.pop(key)
        return data

    return _rewrite(change)


def _stray_rank(folder: Path) -> None:
    (folder / "rank=1.parquet").write_bytes((folder / "rank=0.parquet").read_bytes())


def _counts_off(data: dict[str, Any]) -> dict[str, Any]:
    data["counts"]["written"] += 1
    return data


BROKEN = {
    "a_list": _rewrite(lambda _: []),
    "inputs_a_number": _rewrite(lambda data: {**data, "inputs": 5}),
    "input_without_sha256": _drop_input_key("sha256"),
    "input_without_path": _drop_input_key("path"),
    "stray_rank_beyond_dp": _stray_rank,
    "counts_not_adding_up": _rewrite(_counts_off),
    "no_outputs": _rewrite(lambda data: {**data, "outputs": []}),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_an_untrustworthy_step_folder_is_rebuilt(
    name: str, step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shards"
    assert build(capsys, step_input, "--out", out)[0] == 0
    good = contents(out / "step=1")
    BROKEN[name](out / "step=1")
    settings = load_settings(global_batch_size=2)
    sources = group_steps(find_sources([step_input]))[1]

    assert current_manifest(1, sources, settings, out) is None
    code, stdout, err = build(capsys, step_input, "--out", out)

    assert (code, err) == (0, "")
    assert "up to date" not in stdout and " rows in, " in stdout
    assert contents(out / "step=1") == good


def test_one_file_given_twice_is_refused(
    step_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = step_input / "step=1.parquet"
    out = tmp_path / "shards"

    code, _, err = build(capsys, path, path, "--out", out)

    assert code == 1
    assert err == (
        f"rollout-shards: build: step 1: {path}: rule identical_input_files: "
        f"{path} is given twice: its rows would be read twice\n"
    )
    assert only_refused(out, 1)


def _with_bad_step_2(root: Path, bad: Callable[[Path], None]) -> Path:
    write_step(root, [sample(i, reward=float(i % 2)) for i in range(4)])
    bad(root)
    return root


def _arrow_list_view(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.ipc

    rows = pl.DataFrame([sample(i, step=2, reward=float(i % 2)) for i in range(4)]).to_arrow()
    tokens = pa.array(rows.column("tokens").to_pylist(), pa.list_view(pa.int32()))
    rows = rows.set_column(rows.column_names.index("tokens"), "tokens", tokens)
    with pyarrow.ipc.new_file(root / "step=2.arrow", rows.schema) as sink:
        sink.write_table(rows)


def _dangling_step_folder(root: Path) -> None:
    (root / "step=2").symlink_to(root / "gone")


@pytest.mark.parametrize(
    ("bad", "line"),
    [
        (
            _arrow_list_view,
            "step=2.arrow: rule unreadable_file: unsupported Arrow type "
            "list_view<item: int32> in column tokens",
        ),
        (
            _dangling_step_folder,
            "step=2: rule unreadable_file: cannot open the file (a dangling symlink)",
        ),
    ],
    ids=["unsupported_arrow_type", "dangling_step_folder_link"],
)
def test_a_step_that_cannot_be_read_leaves_the_others_built(
    rows_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad: Callable[[Path], None],
    line: str,
) -> None:
    out = tmp_path / "shards"
    code, stdout, err = build(capsys, _with_bad_step_2(rows_dir, bad), "--out", out)

    assert code == 1
    assert err == f"rollout-shards: build: step 2: {rows_dir}/{line}\n"
    assert (out / "step=1" / "manifest.json").exists()
    assert not (out / "step=2").exists()
    assert "step 1: 4 rows in" in stdout


def test_a_panic_inside_polars_is_one_line_and_the_other_steps_go_on(
    rows_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Polars' PanicException is a BaseException: caught as the file's, not the run's."""
    from pipeline.io import load

    def panics(data: bytes, mapper: Any) -> pl.DataFrame:
        raise pl.exceptions.PanicException("not yet implemented")

    monkeypatch.setitem(load.READERS, "ipc", panics)
    root = _with_bad_step_2(
        rows_dir, lambda root: pl.DataFrame([sample(0, step=2)]).write_ipc(root / "step=2.arrow")
    )
    code, _, err = build(capsys, root, "--out", tmp_path / "shards")

    assert code == 1
    assert err == (
        f"rollout-shards: build: step 2: {root}/step=2.arrow: rule unreadable_file: "
        "cannot read ipc: not yet implemented\n"
    )
    assert (tmp_path / "shards" / "step=1" / "manifest.json").exists()


def test_validate_waits_for_the_success_marker_too(
    rows_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_step(rows_dir / "step=1", [sample(i, reward=float(i % 2)) for i in range(4)])

    code = main(["validate", str(rows_dir), "--require-success-marker", *GBS])
    waiting = capsys.readouterr()
    (rows_dir / "step=1" / "_SUCCESS").write_text("")
    code_complete = main(["validate", str(rows_dir), "--require-success-marker", *GBS])
    complete = capsys.readouterr()

    assert code == 0 and waiting.out == ""
    assert waiting.err == (
        f"rollout-shards: note: skipped {rows_dir}/step=1: no _SUCCESS marker yet "
        "(require_success_marker): the step is not complete, it is built once the marker "
        "is there\n"
    )
    assert code_complete == 0 and "step 1: valid, 4 rows" in complete.out
