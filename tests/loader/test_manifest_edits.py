"""Every trainer's `read_rank` refuses an edited manifest with one line and never returns
data from it: each field the readers depend on, changed in type (`true` for 1, `"4"` for 4,
4.0, null) or in value, for miles (plain, and scheduled with dropped rows), slime and verl.

The build seals its manifest (`manifest_sha256`), so every edit is refused. A manifest
without the seal (written before it existed, or sealed again after the edit) is still
checked for agreement with itself and with the rows: there an edit is refused, or the
reader returns exactly what it returned before the edit; the only edits the rows cannot
tell, listed in SEAL_ONLY, are the reason for the seal.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.loader import rewrite_manifest
from tests.support.samples import build, dropped_rollout_rows, sample, write_step
from tests.support.verl import verl_modules

# Fields every reader depends on, then each trainer's own.
COMMON = [
    "step",
    "settings.dp_size",
    "settings.trainer",
    "counts.written",
    "counts.dropped",
    "outputs.0.path",
    "outputs.0.rows",
    "outputs.1.rows",
    "outputs.0.sha256",
    "outputs.1.raw_reward_sha256",
    "num_train_steps",
    "num_rollouts",
    "num_microbatches",
    "present_columns",
    "dropped_positions",
    "dropped_raw_reward",
    "dynamic_global_batch_size",
    "global_batch_size",
]
OWN = {
    "miles": ["settings.global_batch_size"],
    "miles_scheduled": ["settings.global_batch_size"],
    "slime": ["settings.global_batch_size"],
    "verl": [
        "settings.max_prompt_length",
        "settings.max_response_length",
        "settings.pad_token_id",
        "settings.rollout_n",
        "settings.train_batch_size",
    ],
}
# Value edits the rows cannot tell from the build's, on a manifest without its seal: the
# rows fit a wider verl batch and any pad id; the rollout-side schedule's per-step
# figures, a dynamic batch size and optional columns are the manifest's word alone.
SEAL_ONLY = {
    ("verl", "settings.max_prompt_length", "+1"),
    ("verl", "settings.max_response_length", "+1"),
    ("verl", "settings.pad_token_id", "+1"),
    ("verl", "settings.pad_token_id", "-1"),
    ("verl", "present_columns", "changed"),
    ("verl", "dynamic_global_batch_size", "changed"),
    *((t, "num_rollouts", "changed") for t in ("miles", "miles_scheduled")),
    *((t, "num_microbatches", "changed") for t in ("miles", "miles_scheduled", "slime")),
    *((t, "present_columns", "changed") for t in ("miles", "miles_scheduled", "slime")),
    *((t, "dynamic_global_batch_size", "changed") for t in ("miles", "miles_scheduled")),
    ("miles_scheduled", "dropped_raw_reward", "changed"),
}


def _rows(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [
        sample(i, reward=float(i % 3), group_index=i // 4, response_length=1 + i % 5, **fields)
        for i in range(n)
    ]


STEPS: dict[str, tuple[Callable[[], list[dict[str, Any]]], dict[str, Any]]] = {
    "miles": (lambda: _rows(8), {"global_batch_size": 4, "dp_size": 2}),
    "miles_scheduled": (
        dropped_rollout_rows,
        {
            "global_batch_size": 2,
            "dp_size": 2,
            "cp_size": 1,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 8,
        },
    ),
    "slime": (
        lambda: _rows(8),
        {
            "trainer": "slime",
            "global_batch_size": 4,
            "dp_size": 2,
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 4,
        },
    ),
    "verl": (
        lambda: _rows(8),
        {
            "trainer": "verl",
            "dp_size": 2,
            "rollout_n": 4,
            "train_batch_size": 2,
            "max_prompt_length": 2,  # the rows' longest prompt and response: a width
            "max_response_length": 5,  # one smaller does not hold them
            "pad_token_id": 0,
        },
    ),
}


def _reader(trainer: str) -> Callable[[Path, int], Any]:
    if trainer == "slime":
        from rollout_shards_loader.slime import read_rank as slime_read_rank

        return slime_read_rank
    if trainer == "verl":
        from rollout_shards_loader.verl import read_rank as verl_read_rank

        verl_modules()  # verl as the trainer's environment has it

        return verl_read_rank
    from rollout_shards_loader import read_rank

    return read_rank


def _fingerprint(value: Any) -> Any:
    """A value as plain data, every float and tensor by its bits and type."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.numpy().tobytes())
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tobytes())
    if hasattr(value, "batch") and hasattr(value, "meta_info"):  # verl's DataProto
        batch = {key: value.batch[key] for key in value.batch.keys()}
        return ("DataProto", *map(_fingerprint, (batch, value.non_tensor_batch, value.meta_info)))
    if isinstance(value, dict):
        return [(key, _fingerprint(item)) for key, item in value.items()]
    if isinstance(value, list | tuple):
        return [_fingerprint(item) for item in value]
    if isinstance(value, float):
        return ("float", value.hex())
    return (type(value).__name__, value)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[Any]]]:
    """Each trainer's step folder and what its reader returns for ranks 0 and 1."""
    steps = {}
    for name, (rows, settings) in STEPS.items():
        root = tmp_path_factory.mktemp(name)
        write_step(root / "in", rows())
        build(root / "in", root / "out", **settings)
        folder = root / "out" / "step=1"
        read = _reader(name.partition("_")[0])
        steps[name] = (folder, [_fingerprint(read(folder, rank)) for rank in (0, 1)])
    return steps


def _edits(value: Any) -> Iterator[tuple[str, Any]]:
    """(name, new value): other JSON types, then other values of the same type."""
    if type(value) is int:
        yield from (("true", True), ("text", str(value)), ("float", float(value)), ("null", None))
        yield from (("+1", value + 1), ("-1", value - 1))
    elif type(value) is str:
        yield from (("number", 7), ("null", None), ("changed", value[:-1] + "x"))
    elif type(value) is list:
        yield from (("text", json.dumps(value)), ("null", None), ("booleans", [True] * 2))
        yield "changed", (value[1:] + [value[0]] * 2) if value else [1]
    elif value is None:
        yield from (("true", True), ("text", "4"), ("changed", [2, 2]))


def _cases() -> Iterator[tuple[str, str, str, Any]]:
    for name in STEPS:
        for field in COMMON + OWN[name]:
            for edit, value in _edits(_MANIFESTS[name][field]):
                yield name, field, edit, value


def _collect_manifests() -> dict[str, dict[str, Any]]:
    """The fields of each case's manifest by dotted path, from a build at collection time:
    the edits are drawn from the real values."""
    import tempfile

    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (rows, settings) in STEPS.items():
            root = Path(tmp) / name
            write_step(root / "in", rows())
            manifest = build(root / "in", root / "out", **settings)
            flat: dict[str, Any] = {}
            for field in COMMON + OWN[name]:
                flat[field] = _get(json.loads(json.dumps(manifest)), field)
            found[name] = flat
    return found


def _get(record: Any, field: str) -> Any:
    for key in field.split("."):
        record = record[int(key)] if isinstance(record, list) else record[key]
    return record


def _set(record: Any, field: str, value: Any) -> None:
    *parents, last = field.split(".")
    for key in parents:
        record = record[int(key)] if isinstance(record, list) else record[key]
    record[int(last) if isinstance(record, list) else last] = value


_MANIFESTS = _collect_manifests()
CASES = list(_cases())


def _edited(tmp_path: Path, folder: Path, field: str, value: Any, seal: bool | None) -> Path:
    """A copy of the step folder whose manifest has `field` set to `value`: the build's seal
    kept (None), or the manifest sealed again (True) or unsealed (False) after the edit."""
    copy_root = tmp_path / "out"
    shutil.copytree(folder, copy_root / folder.name)
    edited = copy_root / folder.name
    manifest = json.loads((edited / "manifest.json").read_text())
    _set(manifest, field, copy.deepcopy(value))
    if seal is None:
        (edited / "manifest.json").write_text(json.dumps(manifest))
    else:
        rewrite_manifest(edited, manifest, seal=seal)
    return edited


Edit = tuple[str, str, str, Any]  # the build's name, the field, the edit, the new value


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(str(v)[:24] for v in case))
def test_an_edited_manifest_is_refused_in_one_line(
    built: dict[str, tuple[Path, list[Any]]], tmp_path: Path, case: Edit
) -> None:
    name, field, _, value = case
    folder, _ = built[name]
    edited = _edited(tmp_path, folder, field, value, seal=None)
    read = _reader(name.partition("_")[0])
    for rank in (0, 1):
        with pytest.raises(ValueError) as refused:
            read(edited, rank)
        message = str(refused.value)
        assert "\n" not in message
        assert str(edited) in message or message.startswith("step 1: "), message


VALUE_EDITS = [case for case in CASES if case[2] in ("+1", "-1", "changed")]


@pytest.mark.parametrize("case", VALUE_EDITS, ids=lambda case: "-".join(str(v)[:24] for v in case))
def test_an_unsealed_edit_is_refused_or_changes_nothing(
    built: dict[str, tuple[Path, list[Any]]], tmp_path: Path, case: Edit
) -> None:
    """Without the seal, the manifest's agreement with itself and the rows refuses every
    value edit that would change what a reader returns, but those in SEAL_ONLY."""
    name, field, edit, value = case
    folder, before = built[name]
    edited = _edited(tmp_path, folder, field, value, seal=False)
    read = _reader(name.partition("_")[0])
    changed = False
    for rank in (0, 1):
        try:
            got = _fingerprint(read(edited, rank))
        except ValueError as refused:
            assert "\n" not in str(refused)
            continue
        changed = changed or got != before[rank]
    if (name, field, edit) in SEAL_ONLY:
        return
    assert not changed, f"{name}: {field} {edit} returned other data without the seal"
