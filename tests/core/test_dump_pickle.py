"""miles dumps are read without torch (`pipeline.io.formats.unpickle`): a stdlib zip +
restricted-pickle reader, checked against real `torch.save` files and
`torch.load(weights_only=True)`."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.errors import StepError
from pipeline.io.formats.miles import read_miles_dump
from pipeline.io.formats.unpickle import read_torch_save as _load_payload
from tests.support.cli import digests
from tests.support.miles_dump import sample_dict, write_dump
from tests.support.samples import REPO

DTYPES = [torch.int64, torch.int32, torch.float32, torch.bool, torch.float64, torch.int8]


def tensor_samples() -> list[dict[str, Any]]:
    return [
        sample_dict(
            index=0,
            tokens=torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64),
            loss_mask=torch.tensor([1, 1], dtype=torch.int32),
            rollout_log_probs=torch.tensor([-0.5, -0.125], dtype=torch.float32),
            remove_sample=torch.tensor(False),
            reward=torch.tensor(0.75, dtype=torch.float32),
        ),
        sample_dict(
            index=1,
            tokens=[1, 2, 3, 9],
            loss_mask=[0, 1],
            rollout_log_probs=[-1.0, -2.0],
            metadata={"leaf": 0, "flags": torch.tensor([True, False])},
        ),
        # A strided view and a slice with an offset: both share one storage with a parent.
        sample_dict(
            index=2,
            tokens=torch.arange(12, dtype=torch.int32).reshape(3, 4).t()[1],
            response_length=1,
            rollout_log_probs=torch.linspace(-1, 0, 8)[5:6],
        ),
    ]


def as_plain(value: Any) -> Any:
    """Tensors and numpy arrays as (dtype, nested lists), for comparing the two loaders."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype).removeprefix("torch."), value.tolist())
    if isinstance(value, np.ndarray):
        name = {"bool": "bool"}.get(value.dtype.name, value.dtype.name)
        return (name, value.tolist())
    if isinstance(value, dict):
        return {key: as_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_plain(item) for item in value)
    return value


def test_reads_the_same_values_as_torch_load(tmp_path: Path) -> None:
    payload = {
        "rollout_id": 0,
        "metadata": {"dynamic_global_batch_size": 4},
        "samples": [
            sample_dict(index=i, tokens=(torch.arange(2 + i) % 2).to(dtype).reshape(1, -1))
            for i, dtype in enumerate(DTYPES)
        ]
        + [sample_dict(index=9, tokens=torch.zeros((0, 3)), extra={1, 2}, blob=b"\x00\xff")],
    }
    path = tmp_path / "0.pt"
    torch.save(payload, path)

    ours = _load_payload(path)
    theirs = torch.load(path, weights_only=True)

    assert as_plain(ours) == as_plain(theirs)
    assert ours["samples"][3]["tokens"].dtype == np.bool_


def test_frames_match_a_torch_load_of_the_same_file(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "0.pt", 0, tensor_samples())
    # The same samples with every tensor turned into lists, as torch.load + tolist gives.
    plain = torch.load(path, weights_only=True)
    plain["samples"] = [
        {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for s in plain["samples"]
    ]
    for sample in plain["samples"]:
        sample["metadata"] = {
            k: v.tolist() if isinstance(v, torch.Tensor) else v
            for k, v in sample["metadata"].items()
        }
    expected = read_miles_dump(write_dump(tmp_path / "lists" / "0.pt", 0, plain["samples"]))

    frame = read_miles_dump(path)

    assert frame.equals(expected)
    assert frame["tokens"].to_list() == [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 5, 9]]
    assert frame["rollout_log_probs"].to_list()[2] == [pytest.approx(-2 / 7)]


def test_bfloat16_and_big_numpy_arrays(tmp_path: Path) -> None:
    path = tmp_path / "0.pt"
    torch.save(
        {"a": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "n": np.arange(6).reshape(2, 3)},
        path,
    )
    ours = _load_payload(path)
    assert ours["a"].tolist() == [1.5, -2.0]
    assert ours["n"].tolist() == [[0, 1, 2], [3, 4, 5]]


def fake_torch(root: Path) -> Path:
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text('raise ImportError("no torch here")\n')
    return root


def build(dump: Path, out: Path, pythonpath: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "build", str(dump), "--out", str(out)]
        + ["--global-batch-size", "3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )


def test_shards_are_byte_identical_without_torch(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    write_dump(dump / "rollout_data" / "0.pt", 0, tensor_samples())
    write_dump(dump / "rollout_data" / "1.pt", 1, tensor_samples())
    no_torch = fake_torch(tmp_path / "fake")
    check = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env={**os.environ, "PYTHONPATH": f"{no_torch}{os.pathsep}{REPO}"},
        capture_output=True,
        check=False,
    )
    assert check.returncode != 0 and b"no torch here" in check.stderr

    with_torch = build(dump, tmp_path / "with", str(REPO))
    without = build(dump, tmp_path / "without", f"{no_torch}{os.pathsep}{REPO}")

    assert with_torch.returncode == 0, with_torch.stderr
    assert without.returncode == 0, without.stderr
    assert digests(tmp_path / "with") == digests(tmp_path / "without")
    assert any(name.endswith(".parquet") for name in digests(tmp_path / "with"))


# --- refusals ------------------------------------------------------------------


class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class NotAllowed:
    def __init__(self) -> None:
        self.x = 1


def refused(path: Path) -> str:
    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    violation = error.value.violations[0]
    assert violation.rule == "unsafe_pickle", violation.message
    assert "\n" not in violation.message
    return violation.message


def test_os_system_in_a_torch_save_archive_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(reward=RunsAShellCommand(marker))])

    assert "it needs posix.system" in refused(path) or "it needs os.system" in refused(path)
    assert not marker.exists()


def test_a_class_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(metadata={"x": NotAllowed()})])

    message = refused(path)
    assert "copyreg._reconstructor" in message or "NotAllowed" in message


def test_a_torch_global_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict(metadata={"p": torch.nn.Linear(1, 1)})])

    assert "it needs torch.nn" in refused(path)


def test_a_hand_made_archive_asking_for_eval_is_refused(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "0.pt", 0, [sample_dict()])
    evil = b"\x80\x02cbuiltins\neval\nX\x06\x00\x00\x00'pwn'\x85R."
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, evil if name.endswith("/data.pkl") else data)

    assert "it needs builtins.eval" in refused(path)


def test_object_arrays_in_a_plain_numpy_pickle_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "0.pt"
    torch.save({"rollout_id": 0, "samples": [{"tokens": np.array([None, 1], dtype=object)}]}, path)

    assert "dtype object" in refused(path)


def test_legacy_torch_save_format_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "0.pt"
    torch.save(
        {"rollout_id": 0, "samples": [sample_dict()]}, path, _use_new_zipfile_serialization=False
    )

    with pytest.raises(StepError) as error:
        read_miles_dump(path)

    violation = error.value.violations[0]
    assert violation.rule == "unreadable_file"
    assert "legacy" in violation.message and "re-save" in violation.message
    assert "\n" not in str(error.value)


def test_a_safe_plain_pickle_is_not_a_torch_save_file(tmp_path: Path) -> None:
    path = tmp_path / "0.pt"
    path.write_bytes(pickle.dumps({"rollout_id": 0, "samples": []}, protocol=2))

    with pytest.raises(StepError) as error:
        read_miles_dump(path)
    assert error.value.violations[0].rule == "unreadable_file"
    assert "plain pickle" in error.value.violations[0].message


def test_a_self_containing_list_is_read(tmp_path: Path) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    path = tmp_path / "0.pt"
    torch.save({"rollout_id": 0, "samples": [sample_dict(metadata={"loop": loop})]}, path)

    payload = _load_payload(path)
    inner = payload["samples"][0]["metadata"]["loop"]
    assert inner[1] is inner
