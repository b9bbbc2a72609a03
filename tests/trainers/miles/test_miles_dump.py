"""miles dump import: real `.pt` files written with torch.save, in every layout miles uses."""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from pipeline import columns as c
from pipeline.errors import StepError, UsageError
from pipeline.io.formats.miles import find_miles_dumps, is_miles_dump, read_miles_dump
from tests.core.bad_inputs.generate import CONTRACT_TYPES
from tests.support.miles_dump import leaf_descriptor, sample_dict, write_dump


@pytest.fixture
def dump_details(tmp_path: Path) -> Path:
    """A `--dump-details` folder: two training steps, an eval dump, the dashboard mirror."""
    root = tmp_path / "dump"
    write_dump(root / "rollout_data" / "0.pt", 0, [sample_dict(index=0), sample_dict(index=1)])
    write_dump(root / "rollout_data" / "1.pt", 1, [sample_dict(index=2)])
    write_dump(root / "rollout_data" / "eval_1.pt", 1, [sample_dict(index=0)])
    (root / "dashboard_columns").mkdir()
    pl.DataFrame({"sample_index": [0, 1]}).write_parquet(
        root / "dashboard_columns" / "rollout_0.parquet"
    )
    return root


# --- finding dumps ---------------------------------------------------------------


def test_dump_details_folder_reads_rollout_data_only(dump_details: Path) -> None:
    steps, notes = find_miles_dumps(dump_details)

    assert steps == {
        0: dump_details / "rollout_data" / "0.pt",
        1: dump_details / "rollout_data" / "1.pt",
    }
    assert "skipped eval dump eval_1.pt" in notes
    assert any("dashboard_columns/" in note and "ignored" in note for note in notes)
    assert is_miles_dump(dump_details)


def test_rollout_data_folder(dump_details: Path) -> None:
    steps, notes = find_miles_dumps(dump_details / "rollout_data")

    assert sorted(steps) == [0, 1]
    assert notes == ["skipped eval dump eval_1.pt"]
    assert is_miles_dump(dump_details / "rollout_data")


def test_single_file(dump_details: Path) -> None:
    file = dump_details / "rollout_data" / "1.pt"

    assert find_miles_dumps(file) == ({1: file}, [])
    assert is_miles_dump(file)


def test_single_eval_file_is_skipped_with_a_note(dump_details: Path) -> None:
    assert find_miles_dumps(dump_details / "rollout_data" / "eval_1.pt") == (
        {},
        ["skipped eval dump eval_1.pt"],
    )


def test_templated_names_and_strays(tmp_path: Path) -> None:
    folder = tmp_path / "rollout_data"
    write_dump(folder / "rollout_7.pt", 7, [sample_dict()])
    write_dump(folder / "rollout_eval_7.pt", 7, [sample_dict()])
    write_dump(folder / "latest.pt", 9, [sample_dict()])

    steps, notes = find_miles_dumps(folder)

    assert steps == {7: folder / "rollout_7.pt"}
    assert sorted(notes) == [
        "skipped eval dump rollout_eval_7.pt",
        "skipped latest.pt: not named <step>.pt",
    ]


def test_two_dumps_of_one_step_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "rollout_data"
    write_dump(folder / "3.pt", 3, [sample_dict()])
    write_dump(folder / "03.pt", 3, [sample_dict()])

    with pytest.raises(StepError) as error:
        find_miles_dumps(folder)
    assert error.value.violations[0].rule == "duplicate_step"


def test_what_is_not_a_miles_dump(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    pl.DataFrame({"index": [0]}).write_parquet(tmp_path / "tables" / "step=0.parquet")
    (tmp_path / "empty_details" / "rollout_data").mkdir(parents=True)

    assert not is_miles_dump(tmp_path / "tables")
    assert not is_miles_dump(tmp_path / "tables" / "step=0.parquet")
    assert not is_miles_dump(tmp_path / "empty_details")
    assert not is_miles_dump(tmp_path / "missing")
    with pytest.raises(UsageError):
        find_miles_dumps(tmp_path / "tables" / "step=0.parquet")
    with pytest.raises(UsageError):
        find_miles_dumps(tmp_path / "missing")


# --- reading: columns, types, values -------------------------------------------


def test_a_dump_with_every_field_has_the_column_table_s_input_columns(tmp_path: Path) -> None:
    """The reader takes its columns and their types from the column table: a sample with
    every field set gives exactly the table's input columns, in its order."""
    full = sample_dict(
        group_index=0,
        rollout_id=4,
        prompt="p",
        loss_mask=[1, 1],
        rollout_log_probs=[-0.5, -0.25],
        teacher_log_probs=[-0.5, -0.25],
        rollout_sampling_mask_ids=[5, 6, 7],
        rollout_sampling_mask_offsets=[0, 1, 3],
        weight_versions=["1"],
        metadata={"raw_reward": 1.0, "round_number": 0, "leaf": 0},
        train_metadata={"a": 1},
    )
    # the spans form beside (a step holds one form: the check refuses both, not the read)
    spans = sample_dict(index=1, weight_versions=[[{"version": "1", "abs_start": 0, "abs_end": 1}]])
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, [full, spans]))
    table = [(col.name, col.input) for col in c.INPUT_COLUMNS]
    assert list(frame.schema.items()) == table


def test_every_column_type_and_value(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Add 2 and 2."}]
    samples = [
        sample_dict(
            group_index=3,
            index=12,
            prompt=messages,
            tokens=torch.tensor([101, 102, 103, 104, 105]),
            response_length=3,
            loss_mask=[1, 0, 1],
            reward=0.5,
            rollout_log_probs=torch.tensor([-0.25, -0.5, -1.0], dtype=torch.float32),
            teacher_log_probs=[-0.125, -0.75, -2.0],
            weight_versions=["7", "8"],
            status="truncated",
            metadata={"raw_reward": 2.0, "round_number": 4, "max_trim_tokens": 1},
            train_metadata={"loss": "sft", "weight": 0.5},
        ),
        sample_dict(
            group_index=3,
            index=13,
            tokens=[201, 202, 203],
            response_length=1,
            reward=torch.tensor(1.5, dtype=torch.float64),
            remove_sample=True,
            status="COMPLETED",
            metadata={},
        ),
    ]
    frame = read_miles_dump(write_dump(tmp_path / "rollout_data" / "5.pt", 5, samples))

    # the contract's columns but rollout_id, which a miles dump does not carry
    expected = {name: dtype for name, dtype in CONTRACT_TYPES.items() if name != "rollout_id"}
    assert frame.schema == pl.Schema(expected)
    rows = frame.to_dicts()
    assert rows[0] == {
        "step": 5,
        "group_index": 3,
        "index": 12,
        "leaf": 0,
        "session_version": "v1",
        "status": "truncated",
        "tokens": [101, 102, 103, 104, 105],
        "response_length": 3,
        "loss_mask": [1, 0, 1],
        "reward": 0.5,
        "remove_sample": False,
        "rollout_log_probs": [-0.25, -0.5, -1.0],
        "teacher_log_probs": [-0.125, -0.75, -2.0],
        "weight_versions": ["7", "8"],
        "raw_reward": 2.0,
        "round_number": 4,
        "train_metadata": json.dumps({"loss": "sft", "weight": 0.5}),
        "prompt": json.dumps(messages),
        "metadata": json.dumps({"raw_reward": 2.0, "round_number": 4, "max_trim_tokens": 1}),
    }
    assert rows[1] == {
        "step": 5,
        "group_index": 3,
        "index": 13,
        "leaf": 0,
        "session_version": None,
        "status": "completed",
        "tokens": [201, 202, 203],
        "response_length": 1,
        "loss_mask": None,
        "reward": 1.5,
        "remove_sample": True,
        "rollout_log_probs": None,
        "teacher_log_probs": None,
        "weight_versions": [],
        "raw_reward": None,
        "round_number": None,
        "train_metadata": None,
        "prompt": "What is 2+2?",
        "metadata": "{}",
    }


def test_optional_columns_are_omitted_when_no_sample_has_them(tmp_path: Path) -> None:
    bare = {
        "index": 4,
        "tokens": [1, 2, 3],
        "response_length": 1,
        "reward": 0.0,
        "status": "completed",
    }
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, [sample_dict(), bare]))

    assert frame.columns == [
        "step",
        "group_index",
        "index",
        "leaf",
        "status",
        "tokens",
        "response_length",
        "reward",
        "remove_sample",
        "prompt",
        "metadata",
    ]
    assert frame["remove_sample"].to_list() == [False, False]
    assert frame["group_index"].to_list() == [0, None]
    assert frame["metadata"].to_list() == ["{}", None]


def test_v2_leaves_v1_markers_and_plain_samples(tmp_path: Path) -> None:
    session = {"accumulated_token_ids": [1, 2, 3, 4], "max_trim_tokens": 1}
    samples = [
        # one v2 call (input index 5) that returned three leaves, stamped per miles PR #2536
        sample_dict(
            index=5, rollout_id=5, metadata={"leaf": leaf_descriptor(4, 3, [0, 1, 2, 3, 4])}
        ),
        sample_dict(
            index=5, rollout_id=5, metadata={"leaf": leaf_descriptor(5, 3, [0, 1, 2, 3, 5])}
        ),
        sample_dict(
            index=5, rollout_id=5, metadata={"leaf": leaf_descriptor(8, 7, [0, 1, 6, 7, 8])}
        ),
        # a v2 singleton keeps the input's (null) rollout_id
        sample_dict(index=6, metadata={"leaf": leaf_descriptor(2, 1, [0, 1, 2])}),
        # a v1 reply: the session metadata merged into its one sample
        sample_dict(index=7, metadata={**session, "tito_session_mismatch": []}),
        # no session server
        sample_dict(index=8),
    ]
    frame = read_miles_dump(write_dump(tmp_path / "rollout_data" / "2.pt", 2, samples))

    assert frame["index"].to_list() == [5, 5, 5, 6, 7, 8]
    assert frame["leaf"].to_list() == [0, 1, 2, 0, 0, 0]
    assert frame["rollout_id"].to_list() == [5, 5, 5, None, None, None]
    assert frame["session_version"].to_list() == ["v2", "v2", "v2", "v2", "v1", None]
    assert json.loads(frame["metadata"][2])["leaf"]["node_id"] == 8


def test_numeric_leaf_in_metadata_is_the_position(tmp_path: Path) -> None:
    samples = [
        sample_dict(index=1, rollout_id=1, metadata={"leaf": 1}),
        sample_dict(index=1, rollout_id=1, metadata={"leaf": 0}),
    ]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert frame["leaf"].to_list() == [1, 0]
    assert frame["session_version"].to_list() == ["v2", "v2"]


def test_session_version_override(tmp_path: Path) -> None:
    samples = [
        sample_dict(index=0, metadata={"leaf": leaf_descriptor(1, 0, [0, 1])}),
        sample_dict(index=1),
    ]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    assert read_miles_dump(path, session_version="v1")["session_version"].to_list() == ["v1", "v1"]
    assert read_miles_dump(path, session_version="v2")["session_version"].to_list() == ["v2", "v2"]
    with pytest.raises(UsageError):
        read_miles_dump(path, session_version="v3")


def test_no_session_markers_and_no_override_omits_session_version(tmp_path: Path) -> None:
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, [sample_dict()]))

    assert "session_version" not in frame.columns


def test_reward_dict_becomes_a_struct_of_its_numeric_fields(tmp_path: Path) -> None:
    samples = [
        sample_dict(index=0, reward={"score": 2, "accuracy": True, "pred": "4"}),
        sample_dict(index=1, reward={"score": 6.5, "accuracy": False, "pred": "5"}),
        sample_dict(index=2, reward=None, status="aborted"),
    ]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert frame.schema["reward"] == pl.Struct({"score": pl.Float64(), "accuracy": pl.Float64()})
    assert frame["reward"].to_list() == [
        {"score": 2.0, "accuracy": 1.0},
        {"score": 6.5, "accuracy": 0.0},
        None,
    ]


def test_reward_dict_mixed_with_numbers_is_refused(tmp_path: Path) -> None:
    samples = [sample_dict(index=0, reward={"score": 1.0}), sample_dict(index=1, reward=1.0)]

    with pytest.raises(StepError) as error:
        read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))
    assert error.value.violations[0].rule == "malformed_dump"
    assert "reward" in str(error.value)


def test_weight_version_spans_are_carried_per_call(tmp_path: Path) -> None:
    # miles since PR #1891: one list of spans per generate call (WeightVersionsPerCall.to_dicts);
    # `legacy_weight_versions` (an old dump's strings as miles since #1892 keeps them) is no
    # Sample field at either commit, so its trainer never gets it
    spans = [
        [{"version": "3", "abs_start": 2, "abs_end": 4}],
        [],
        [
            {"version": "3", "abs_start": 6, "abs_end": 7},
            {"version": "4", "abs_start": 7, "abs_end": 9},
        ],
    ]
    samples = [
        sample_dict(index=0, weight_versions=spans),
        sample_dict(index=1, weight_versions=[], legacy_weight_versions=["2"]),
    ]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert "weight_versions" not in frame.columns
    assert frame["weight_version_spans"].to_list() == [spans, []]


def test_legacy_weight_versions_alone_are_not_carried(tmp_path: Path) -> None:
    samples = [sample_dict(index=0, weight_versions=[], legacy_weight_versions=["2"])]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))
    assert not {"weight_versions", "weight_version_spans"} & set(frame.columns)


def test_numpy_arrays_and_scalars_load(tmp_path: Path) -> None:
    # routing replay stores rollout_routed_experts as an int32 array (not a contract column)
    samples = [
        sample_dict(
            tokens=np.array([1, 2, 3, 4, 5], dtype=np.int64),
            reward=np.float64(0.25),
            rollout_routed_experts=np.zeros((4, 2, 2), dtype=np.int32),
        )
    ]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert frame["tokens"].to_list() == [[1, 2, 3, 4, 5]]
    assert frame["reward"].to_list() == [0.25]


def test_empty_dump(tmp_path: Path) -> None:
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, []))

    assert frame.height == 0
    assert {"step", "index", "leaf", "status", "tokens", "response_length"} <= set(frame.columns)


# --- reading: refusals ---------------------------------------------------------


class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_torch_save_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "rollout_data" / "0.pt"
    write_dump(path, 0, [sample_dict(metadata={"x": RunsAShellCommand(marker)})])

    with pytest.raises(StepError) as error:
        read_miles_dump(path)

    violation = error.value.violations[0]
    assert violation.rule == "unsafe_pickle"
    assert "refused" in violation.message
    assert "system" in violation.message
    assert str(path) in violation.message
    assert "\n" not in str(error.value)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_malicious_plain_pickle_is_refused_and_never_runs(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "0.pt"
    path.write_bytes(
        pickle.dumps({"rollout_id": 0, "samples": [RunsAShellCommand(marker)]}, protocol=protocol)
    )

    with pytest.raises(StepError) as error:
        read_miles_dump(path)

    assert error.value.violations[0].rule == "unsafe_pickle"
    assert "system" in error.value.violations[0].message
    assert not marker.exists()


def test_object_arrays_are_refused(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(tokens=np.array([1, "x"], dtype=object))])

    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "unsafe_pickle"


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_file_is_unreadable(tmp_path: Path, damage: str) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(index=i) for i in range(20)])
    data = path.read_bytes()
    path.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"not a dump", "empty": b""}[damage]
    )

    with pytest.raises(StepError) as error:
        read_miles_dump(path)

    assert error.value.violations[0].rule == "unreadable_file"
    assert str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_file_name_and_rollout_id_must_agree(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "rollout_data" / "3.pt", 4, [sample_dict()])

    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "step_mismatch"


def test_not_a_dump_payload(tmp_path: Path) -> None:
    path = tmp_path / "0.pt"
    torch.save({"model": torch.zeros(2)}, path)

    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "malformed_dump"


def test_field_of_the_wrong_type_names_field_and_sample(tmp_path: Path) -> None:
    samples = [sample_dict(index=0), sample_dict(index=1, tokens=["a", "b"])]

    with pytest.raises(StepError) as error:
        read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    violation = error.value.violations[0]
    assert violation.rule == "malformed_dump"
    assert violation.step == 0
    assert "field tokens" in violation.message
    assert "sample 1" in violation.message


def test_reading_does_not_need_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(tokens=torch.tensor([1, 2, 3]))])
    expected = read_miles_dump(path)
    monkeypatch.setitem(sys.modules, "torch", None)

    assert read_miles_dump(path).equals(expected)


# --- reading: what a file may make the reader build -------------------------------

PLACEHOLDER = "RAW-PICKLE-OPCODES"


def _text(value: str) -> bytes:
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(value: int) -> bytes:
    if 0 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    return b"\x8a\x08" + value.to_bytes(8, "little", signed=True)


def _tuple(values: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(map(_int, values)) + b"t"


def raw_dump(
    path: Path, opcodes: bytes, storages: dict[str, bytes] | None = None, **fields: Any
) -> Path:
    """A torch.save-style archive whose sample 0 holds, in the field named by the value
    PLACEHOLDER in `fields`, whatever the pickle `opcodes` build (written by hand, as a
    hostile file would be)."""
    samples = [sample_dict(index=0, **fields), sample_dict(index=1)]
    pickled = pickle.dumps({"rollout_id": 0, "samples": samples}, protocol=2)
    assert pickled.count(_text(PLACEHOLDER)) == 1
    pickled = pickled.replace(_text(PLACEHOLDER), opcodes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
    return path


def tensor_opcodes(shape: tuple[int, ...], stride: tuple[int, ...], numel: int = 1) -> bytes:
    """torch._utils._rebuild_tensor_v2 on storage `0` (int64), as torch.save pickles it."""
    storage = b"(" + _text("storage") + b"ctorch\nLongStorage\n" + _text("0")
    storage += _text("cpu") + _int(numel) + b"tQ"
    return (
        b"ctorch._utils\n_rebuild_tensor_v2\n("
        + storage
        + _int(0)
        + _tuple(shape)
        + _tuple(stride)
        + b"\x89ccollections\nOrderedDict\n)RtR"
    )


def malformed(path: Path) -> str:
    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    violation = error.value.violations[0]
    assert violation.rule == "malformed_dump", violation.line()
    assert str(path) in violation.message
    assert "\n" not in violation.line()
    return violation.message


ARRAY_OF_4E8 = {
    "reconstruct": b"cnumpy._core.multiarray\n_reconstruct\n(cnumpy\nndarray\n"
    + _tuple((400_000_000,))
    + _text("f8")
    + b"tR",
    "ndarray": b"cnumpy\nndarray\n(" + _tuple((400_000_000,)) + _text("f8") + b"tR",
}


@pytest.mark.parametrize("how", sorted(ARRAY_OF_4E8))
def test_an_array_larger_than_the_file_allows_is_refused(tmp_path: Path, how: str) -> None:
    path = raw_dump(tmp_path / "0.pt", ARRAY_OF_4E8[how], metadata={"x": PLACEHOLDER})

    assert path.stat().st_size < 2000
    message = malformed(path)
    assert "an array of shape (400000000,) takes it beyond the 1,048,576 bytes of arrays" in message


def test_a_zero_stride_tensor_is_refused_before_it_is_copied(tmp_path: Path) -> None:
    expanded = torch.zeros(1, dtype=torch.int64).expand(400_000_000)
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(rollout_routed_experts=expanded)])

    assert path.stat().st_size < 4000
    assert "a tensor of shape (400000000,) takes it beyond" in malformed(path)


def test_a_hand_made_zero_stride_tensor_is_refused(tmp_path: Path) -> None:
    opcodes = tensor_opcodes((1000, 1000, 1000), (0, 0, 0))
    path = raw_dump(tmp_path / "0.pt", opcodes, {"0": struct.pack("<q", 7)}, tokens=PLACEHOLDER)

    assert "a tensor of shape (1000, 1000, 1000) takes it beyond" in malformed(path)


def test_a_small_expanded_tensor_is_read(tmp_path: Path) -> None:
    tokens = torch.tensor([7], dtype=torch.int64).expand(5)
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(tokens=tokens)])

    assert read_miles_dump(path)["tokens"].to_list() == [[7, 7, 7, 7, 7]]


def test_bytearray_of_a_size_is_refused(tmp_path: Path) -> None:
    opcodes = b"c__builtin__\nbytearray\n(" + _int(4_000_000_000) + b"tR"
    path = raw_dump(tmp_path / "0.pt", opcodes, metadata={"x": PLACEHOLDER})

    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "unsafe_pickle"
    assert "bytearray of int" in error.value.violations[0].message


def test_a_length_no_file_holds_is_one_line(tmp_path: Path) -> None:
    opcodes = b"\x8e" + (2**62).to_bytes(8, "little")  # BINBYTES8 beyond any address space
    path = raw_dump(tmp_path / "0.pt", opcodes, metadata={"x": PLACEHOLDER})

    assert "asks for more memory than a dump of" in malformed(path)


def test_self_referencing_metadata_is_refused(tmp_path: Path) -> None:
    loop: dict[str, Any] = {"source": "gsm8k"}
    loop["self"] = loop
    samples = [sample_dict(index=0), sample_dict(index=1, metadata=loop)]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    message = malformed(path)
    assert "field metadata on sample 1 (" in message
    assert message.endswith("refers to itself (a cycle)")


def test_a_list_holding_itself_never_reaches_polars(tmp_path: Path) -> None:
    loop: list[Any] = [1, 2]
    loop.append(loop)
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(index=0, tokens=loop)])

    message = malformed(path)
    preview = "([1, 2, [1, 2, [1, 2, [...]]]])"
    assert f"field tokens does not fit List(Int32) on sample 0 {preview}" in message
    assert message.endswith("element 2 is the list itself (a cycle)")


@pytest.mark.parametrize("field", ["index", "status", "response_length"])
def test_a_nested_value_in_a_scalar_field_never_reaches_polars(tmp_path: Path, field: str) -> None:
    nested: list[Any] = [1]
    for _ in range(200):
        nested = [nested]
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(index=0), sample_dict(**{field: nested})])

    message = malformed(path)
    assert f"field {field} does not fit" in message
    belongs = "a single value" if field == "status" else "a number"
    assert message.endswith(f"on sample 1 ([[[[...]]]]): a list where {belongs} belongs")


def test_a_structure_shared_to_expand_beyond_the_file_is_refused(tmp_path: Path) -> None:
    shared: list[Any] = list(range(10))
    for _ in range(64):  # 2**64 copies of ten numbers once written out as JSON
        shared = [shared, shared]
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(metadata={"x": shared})])

    assert path.stat().st_size < 4000
    assert "field metadata of sample 0 takes it beyond the 1,048,576 values" in malformed(path)


def test_one_token_list_shared_by_every_sample_is_refused(tmp_path: Path) -> None:
    tokens = [3] * 100_000
    samples = [sample_dict(index=i, tokens=tokens) for i in range(64)]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    assert "field tokens takes it beyond the 1,048,576 values" in malformed(path)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (5, "(5): a int where a list of versions belongs"),
        ([1, 2], "([1, 2]): version 1 is a int, not a string"),
        (["1", ["2"]], "version ['2'] is a list, not a string"),
        ([[{"version": "1", "abs_start": 0, "abs_end": 1}], "2"], "call 1 is a str, not a list"),
        ([[{"version": 3.0, "abs_start": 0, "abs_end": 1}]], "version 3.0 is a float, not a"),
        ([[{"version": "3", "abs_start": 0}]], "has keys ['abs_start', 'version'], not"),
        ([[{"version": "3", "abs_start": 0, "abs_end": True}]], "abs_end True is not an int64"),
        ([[{"version": "3", "abs_start": 2**63, "abs_end": 1}]], "is not an int64"),
        ([[["3", 0, 1]]], "span 0 of call 0 is a list, not a span dict"),
    ],
)
def test_weight_versions_are_strings_never_converted(
    tmp_path: Path, value: Any, reason: str
) -> None:
    samples = [
        sample_dict(index=0, weight_versions=["1"]),
        sample_dict(index=1, weight_versions=value),
    ]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    message = malformed(path)
    assert "field weight_versions on sample 1 " in message
    assert reason in message


@pytest.mark.parametrize("value", [2, 1, 0, "true", 1.0])
def test_remove_sample_is_a_bool_never_converted(tmp_path: Path, value: Any) -> None:
    samples = [sample_dict(index=0), sample_dict(index=1, remove_sample=value)]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    message = malformed(path)
    assert f"field remove_sample does not fit Boolean on sample 1 ({value!r})" in message


def test_a_bool_tensor_remove_sample_is_read(tmp_path: Path) -> None:
    samples = [sample_dict(index=0, remove_sample=torch.tensor(True)), sample_dict(index=1)]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert frame["remove_sample"].to_list() == [True, False]


def test_one_tensor_shared_by_every_sample_is_refused(tmp_path: Path) -> None:
    tokens = torch.arange(100_000, dtype=torch.int64)  # stored once, referenced 64 times
    samples = [sample_dict(index=i, tokens=tokens) for i in range(64)]
    path = write_dump(tmp_path / "0.pt", 0, samples)

    assert path.stat().st_size < 1_000_000
    assert "field tokens takes it beyond the 3," in malformed(path)


def test_a_tensor_shared_by_samples_within_the_bound_is_read(tmp_path: Path) -> None:
    tokens = torch.arange(5, dtype=torch.int64)
    samples = [sample_dict(index=i, tokens=tokens) for i in range(8)]
    frame = read_miles_dump(write_dump(tmp_path / "0.pt", 0, samples))

    assert frame["tokens"].to_list() == [[0, 1, 2, 3, 4]] * 8


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"reward": True}, "field reward does not fit Float64 on sample 1 (True): a bool where"),
        (
            {"tokens": [1, True]},
            "(Int32) on sample 1 ([1, True]): element 1 is a bool, not a number",
        ),
        ({"rollout_log_probs": [np.bool_(True)]}, "element 0 is a bool, not a number"),
    ],
)
def test_a_bool_where_a_number_belongs_is_refused(
    tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(index=0), sample_dict(index=1, **fields)])

    assert reason in malformed(path)


def test_a_compressed_storage_is_never_inflated_past_the_file(tmp_path: Path) -> None:
    numel = 6_250_000  # 50 MB of int64 zeros, a few dozen KB once deflated
    stored = raw_dump(
        tmp_path / "stored.pt", tensor_opcodes((numel,), (1,), numel), tokens=PLACEHOLDER
    )
    path = tmp_path / "0.pt"
    with zipfile.ZipFile(stored) as source, zipfile.ZipFile(path, "w") as archive:
        for name in source.namelist():
            archive.writestr(name, source.read(name), zipfile.ZIP_DEFLATED)
        archive.writestr("archive/data/0", bytes(8 * numel), zipfile.ZIP_DEFLATED)

    assert path.stat().st_size < 200_000
    assert "archive member archive/data/0 unpacks to 50,000,000 bytes, more than the" in (
        malformed(path)
    )


def test_a_dump_of_large_bfloat16_tensors_is_read(tmp_path: Path) -> None:
    # The costliest real case: read, widened to float32 and copied, 5 bytes per byte of file.
    log_probs = torch.linspace(-1, 0, 1_000_000, dtype=torch.bfloat16)
    tokens = torch.zeros(1_000_000, dtype=torch.int32)
    sample = sample_dict(tokens=tokens, response_length=1_000_000, rollout_log_probs=log_probs)
    path = write_dump(tmp_path / "0.pt", 0, [sample])

    frame = read_miles_dump(path)

    assert path.stat().st_size > 6_000_000
    assert frame["rollout_log_probs"].to_list()[0] == log_probs.float().tolist()
