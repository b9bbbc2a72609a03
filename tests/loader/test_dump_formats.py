"""One frame for every trainer's dump (`pipeline/io/formats`): the same table of
malformations, written into a miles, a slime and a verl dump of step 1 beside a valid step 2,
gives for each trainer one line naming the file and what is wrong, exit status 1, nothing of
step 1 and step 2 built. A step number beyond int64 is refused alike in a table's name, a
step folder's and a dump's."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from pipeline.cli import main
from tests.support.verl import DUMP_SETTINGS, dump_rows
from tests.support.verl import write_dump as write_verl_dump

HUGE = "99999999999999999999"  # beyond int64 (9223372036854775807)


class _RunsAShellCommand:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


# --- miles and slime: torch.save({"rollout_id", "samples": [Sample.to_dict()]}) ---------


def _samples() -> list[dict[str, Any]]:
    """Four samples in two groups of two: a miles or slime step of global batch size 2."""
    return [
        {
            "index": i,
            "group_index": i // 2,
            "tokens": [1, 2, 3, 4, 5],
            "response_length": 2,
            "loss_mask": [1, 1],
            "reward": float(i % 2),
            "status": "completed",
            "remove_sample": False,
            "metadata": {},
        }
        for i in range(4)
    ]


def _torch_save_dump(root: Path, step: int, edit: Callable[[dict[str, Any]], None] | None) -> Path:
    payload: dict[str, Any] = {"rollout_id": step, "samples": _samples()}
    if edit is not None:
        edit(payload)
    path = root / "rollout_data" / f"{step}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def _on_sample_1(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda payload: payload["samples"][1].update(fields)


def _payload(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda payload: payload.update(fields)


TORCH_SAVE_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "wrong_shape": _on_sample_1(tokens=[[1, 2], [3]]),
    "zero_width": _on_sample_1(tokens=[], response_length=2),
    "zero_rows": _payload(samples=[]),
    "null": _on_sample_1(tokens=None),
    "wrong_dtype": _on_sample_1(tokens=[1.5, 2.0, 3.0, 4.0, 5.0]),
    "forbidden_global": _on_sample_1(metadata={"x": _RunsAShellCommand()}),
    "step_in_dump_beyond_int64": _payload(rollout_id=int(HUGE)),
}


# --- verl: DataProto.save_to_disk under <folder>/<step>/gen_batch.dp ------------------


def _batch(edit: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(gen: Any) -> Any:
        batch = gen.batch
        keys = list(batch.keys())
        tensors = {key: batch[key] for key in keys}
        edit(tensors)
        from tensordict import TensorDict

        rows = next(iter(tensors.values())).shape[0]
        gen.batch = TensorDict(tensors, batch_size=[rows])
        if "uid" in gen.non_tensor_batch:
            gen.non_tensor_batch["uid"] = gen.non_tensor_batch["uid"][:rows]
        return gen

    return apply


def _zero_width(tensors: dict[str, Any]) -> None:
    prompt = tensors["prompts"].shape[1]
    for key in ("responses", "response_mask", "rm_scores", "rollout_log_probs"):
        tensors[key] = tensors[key][:, :0]
    tensors["attention_mask"] = tensors["attention_mask"][:, :prompt]
    tensors.pop("position_ids", None)
    tensors.pop("input_ids", None)


def _zero_rows(tensors: dict[str, Any]) -> None:
    for key in tensors:
        tensors[key] = tensors[key][:0]


def _uid_null(gen: Any) -> Any:
    gen.non_tensor_batch["uid"][1] = None
    return gen


def _extras(gen: Any) -> Any:
    rows = len(gen.non_tensor_batch["uid"])
    gen.non_tensor_batch["extras"] = np.array([_RunsAShellCommand()] * rows, dtype=object)
    return gen


VERL_EDITS: dict[str, Callable[[Any], Any]] = {
    "wrong_shape": _batch(lambda t: t.update(prompts=t["prompts"][:, None, :])),
    "zero_width": _batch(_zero_width),
    "zero_rows": _batch(_zero_rows),
    "null": _uid_null,
    "wrong_dtype": _batch(lambda t: t.update(prompts=t["prompts"].float())),
    "forbidden_global": _extras,
}


# --- the table --------------------------------------------------------------------------

TORCH_SAVE_LINES = {
    "wrong_shape": ("malformed_dump", "field tokens does not fit List(Int32) on sample 1"),
    "zero_width": ("response_within_tokens", "response_length must be within"),
    "null": ("tokens_not_nullable", "tokens must not be null"),
    "wrong_dtype": ("malformed_dump", "field tokens does not fit List(Int32) on sample 1"),
    "forbidden_global": ("unsafe_pickle", "refused to unpickle: it needs posix.system"),
    "step_in_dump_beyond_int64": ("step_out_of_range", f"rollout_id {HUGE} is beyond int64"),
}
FILE_LINES = {
    "truncated": ("unreadable_file", "cannot be read as a"),
    "step_name_beyond_int64": ("step_out_of_range", f"step number {HUGE} in the name"),
    "folder_named_like_dump": ("unreadable_file", "cannot open the file (a folder)"),
    "symlink_loop": ("unreadable_file", "cannot open the file (a symlink loop)"),
}
LINES: dict[str, dict[str, tuple[str, str]]] = {
    "miles": {
        **TORCH_SAVE_LINES,
        "zero_rows": ("not_enough_samples", "not enough samples 0"),
        **FILE_LINES,
    },
    "slime": {
        **TORCH_SAVE_LINES,
        "zero_rows": ("schedule_no_full_step", "the batch has 0 rollouts"),
        **FILE_LINES,
    },
    "verl": {
        "wrong_shape": ("malformed_dump", "prompts has 3 dimensions (shape (12, 1, 6))"),
        "zero_width": ("malformed_dump", "its response is 0 wide"),
        "zero_rows": ("train_batch_size_groups", "0 rows make 0 prompt groups"),
        "null": ("malformed_dump", "uid holds None (NoneType) on row 1, not a string"),
        "wrong_dtype": ("malformed_dump", "prompts holds float32, not"),
        "forbidden_global": ("unsafe_pickle", "refused to unpickle: it needs posix.system"),
        **FILE_LINES,
    },
}
ARGS = {
    "miles": ["--global-batch-size", "2"],
    "slime": [
        "--trainer", "slime", "--global-batch-size", "2", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2",
    ],
    "verl": [
        "--trainer", "verl", "--dp-size", "2", "--rollout-n", "4", "--train-batch-size", "3",
        "--max-prompt-length", "6", "--max-response-length", "7",
        "--pad-token-id", str(DUMP_SETTINGS["pad_token_id"]),
        "--balance-batch", "true", "--norm-adv-by-std-in-grpo", "true",
    ],
}  # fmt: skip
# Lines that name no file: a step of zero rows is refused by its trainer's batch rule.
STEP_LEVEL = {"not_enough_samples", "schedule_no_full_step", "train_batch_size_groups"}
CASES = [(trainer, case) for trainer, lines in LINES.items() for case in lines]


def _dumps(trainer: str, root: Path, case: str) -> tuple[Path, Path]:
    """The input (a valid step 2 and step 1 with `case`) and the path the line names."""
    if trainer == "verl":
        edit = VERL_EDITS.get(case)
        folder = write_verl_dump(root, dump_rows(), 2, True)
        write_verl_dump(root, dump_rows(), 1, True, edit)
        bad = folder / "1" / "gen_batch.dp"
    else:
        _torch_save_dump(root, 2, None)
        bad = _torch_save_dump(root, 1, TORCH_SAVE_EDITS.get(case))
        folder = root
    if case == "truncated":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif case == "step_name_beyond_int64":
        if trainer == "verl":
            bad = bad.parent.rename(bad.parent.with_name(HUGE))
        else:
            bad = bad.rename(bad.with_name(f"{HUGE}.pt"))
    elif case == "folder_named_like_dump":
        bad.unlink()
        bad.mkdir()
        (bad / "data.pkl").write_bytes(b"")
    elif case == "symlink_loop":
        bad.unlink()
        bad.symlink_to(bad.name)
    return folder, bad


@pytest.mark.parametrize(("trainer", "case"), CASES)
def test_a_malformed_dump_is_one_line_and_the_other_step_builds(
    trainer: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, bad = _dumps(trainer, tmp_path / "dump", case)
    out = tmp_path / "out"
    capsys.readouterr()
    status = main(["build", str(folder), "--out", str(out), *ARGS[trainer]])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " rule " in line]
    rule, text = LINES[trainer][case]
    assert status == 1, err
    assert len(lines) == 1, err
    (line,) = lines
    assert f"rule {rule}: " in line and text in line, line
    if rule not in STEP_LEVEL:
        assert str(bad) in line, line
    if case != "step_name_beyond_int64":
        assert line.startswith("rollout-shards: build: step 1: "), line
    assert "Traceback" not in err
    assert not (out / "step=1").exists()
    assert pl.read_parquet(out / "step=2" / "rank=0.parquet").height > 0  # step 2 built
    assert not Path("pwned").exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "name", [f"step={HUGE}.parquet", f"step={HUGE}/part.parquet", f"rollout_{HUGE}.pt"]
)
def test_a_step_beyond_int64_is_refused_alike_in_a_table_folder_or_dump_name(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "rows"
    table = pl.DataFrame(
        {"index": [0, 1], "group_index": [0, 0], "status": ["completed"] * 2,
         "tokens": [[1, 2, 3]] * 2, "response_length": [1, 1], "reward": [0.0, 1.0]},
        schema_overrides={"tokens": pl.List(pl.Int32), "response_length": pl.Int32},
    )  # fmt: skip
    (root / name).parent.mkdir(parents=True)
    if name.endswith(".pt"):  # a --save-debug-rollout-data folder: every step a dump
        torch.save({"rollout_id": 1, "samples": _samples()}, root / name)
        torch.save({"rollout_id": 2, "samples": _samples()}, root / "rollout_2.pt")
    else:
        table.write_parquet(root / name)
        table.write_parquet(root / "step=2.parquet")
    out = tmp_path / "out"
    capsys.readouterr()
    status = main(["build", str(root), "--out", str(out), "--global-batch-size", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " rule " in line]
    assert status == 1
    assert lines == [
        f"rollout-shards: build: {root / name.split('/')[0]}: rule step_out_of_range: "
        f"step number {HUGE} in "
        "the name is beyond int64: no step can carry it"
    ]
    assert sorted(p.name for p in out.glob("step=*")) == ["step=2"]


def test_validate_reports_a_refused_name_in_its_json(tmp_path: Path, capsys: Any) -> None:
    """A name refused (no step can carry it) and a step whose dump is a folder: one entry
    each beside the valid step."""
    root = tmp_path / "rollout_data"
    _torch_save_dump(tmp_path, 2, None)
    (root / "1.pt").mkdir()
    (root / f"{HUGE}.pt").symlink_to("2.pt")
    capsys.readouterr()
    status = main(["validate", str(root), "--global-batch-size", "2", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1
    assert [(entry["step"], entry["valid"]) for entry in report] == [
        (None, False),
        (1, False),
        (2, True),
    ]
    found = [(v["rule"], v["files"]) for e in report[:2] for v in e["violations"]]
    assert found == [
        ("step_out_of_range", [str(root / f"{HUGE}.pt")]),
        ("unreadable_file", [str(root / "1.pt")]),
    ]


def test_a_dump_of_zero_rows_reads_as_zero_rows_in_every_format(tmp_path: Path) -> None:
    """Not malformed: a step of no rows is refused by its trainer's batch rule, as a table of
    no rows is (above); the read itself gives the columns and no row."""
    from pipeline.io.formats.miles import read_miles_dump
    from pipeline.io.formats.verl import read_verl_dump

    torch_save = _torch_save_dump(tmp_path / "m", 3, TORCH_SAVE_EDITS["zero_rows"])
    assert read_miles_dump(torch_save).height == 0
    for uid in (True, False):
        folder = write_verl_dump(tmp_path / f"v{uid}", dump_rows(), 3, uid, VERL_EDITS["zero_rows"])
        frame = read_verl_dump(folder / "3" / "gen_batch.dp", 3)
        assert frame.height == 0 and {"tokens", "group_index", "reward"} <= set(frame.columns)


def test_a_pickle_of_a_format_s_payload_is_not_read_as_another(tmp_path: Path) -> None:
    """A verl step folder holding a miles dump's pickle is not a DataProto: one line."""
    from pipeline.errors import StepError
    from pipeline.io.formats.verl import read_verl_dump

    path = tmp_path / "3" / "gen_batch.dp"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps({"rollout_id": 3, "samples": _samples()}))
    with pytest.raises(StepError) as caught:
        read_verl_dump(path, 3)
    (violation,) = caught.value.violations
    assert violation.rule == "malformed_dump"
    assert violation.message == (
        f"{path}: not a DataProto pickled by save_to_disk (a verl DataProto dump)"
    )


def test_a_symlink_loop_named_like_a_verl_dump_is_named(tmp_path: Path) -> None:
    """Given as an input, or beside verl's step folders: never passed over without a word."""
    from pipeline.errors import Violation
    from pipeline.io.discovery import find_sources

    folder = write_verl_dump(tmp_path / "dump", dump_rows(), 2, True)
    loop = folder / "x.dp"
    loop.symlink_to("x.dp")
    for given in (folder, loop):
        refused: list[Violation] = []
        sources = find_sources([given], refused=refused)
        assert [s.step for s in sources] == ([2] if given == folder else [])
        assert [(v.rule, v.step, v.files) for v in refused] == [
            ("unreadable_file", None, [str(loop)])
        ]
        assert "but a symlink loop, not a file" in refused[0].message


def test_a_dump_beside_tables_is_named_in_a_note(tmp_path: Path) -> None:
    from pipeline.io.discovery import find_sources

    root = tmp_path / "rows"
    root.mkdir()
    pl.DataFrame({"index": [0]}).write_parquet(root / "step=1.parquet")
    (root / "rollout_3.pt").mkdir()
    (root / "x.dp").symlink_to("x.dp")
    notes: list[str] = []
    assert [s.step for s in find_sources([root], notes=notes)] == [1]
    why = "named like a trainer's dump, in a folder of tables: not read"
    tail = " (give the dumps' folder as an input of its own)"
    assert notes == [f"skipped {root / name}: {why}{tail}" for name in ("rollout_3.pt", "x.dp")]
