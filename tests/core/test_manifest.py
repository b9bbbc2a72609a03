"""The manifest's records are dataclasses read strictly (by pydantic): a manifest reads back
what it wrote, and one of another shape reads as none (the step is rebuilt)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.manifest import Counts, InputFile, Manifest, OutputFile, ShapeError
from pipeline.step.freshness import manifest_at
from tests.support.manifests import manifest


def test_a_manifest_reads_back_what_it_wrote(tmp_path: Path) -> None:
    written = manifest()
    written.write(tmp_path / "manifest.json")
    read = manifest_at(tmp_path / "manifest.json")
    assert read == written
    assert isinstance(read.inputs[0], InputFile) and isinstance(read.counts, Counts)
    assert json.loads(written.to_json())["counts"]["untrained"] == 0


def _with(change: dict[str, Any]) -> str:
    data = manifest().to_dict()
    for path, value in change.items():
        *parents, leaf = path.split(".")
        target = data
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is KeyError:
            del target[leaf]
        else:
            target[leaf] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "change",
    [
        {"step": True},  # a bool is not an int
        {"step": "3"},
        {"step": 3.0},
        {"is_compact": 1},
        {"num_rollouts": [4.0]},
        {"stats": {"x": "0.5"}},
        {"stats": {"x": None}},
        {"counts.written": KeyError},  # a required field missing
        {"counts.extra": 1},  # an unknown field
        {"inputs": [{"path": "a", "sha256": "b"}]},
        {"outputs.0.tokens": "40"},
        {"repaired": ["cleared"]},
        {"surprise": []},
    ],
)
def test_a_manifest_of_another_shape_reads_as_none(tmp_path: Path, change: dict) -> None:
    (tmp_path / "manifest.json").write_text(_with(change))
    assert manifest_at(tmp_path / "manifest.json") is None
    with pytest.raises(ShapeError):
        Manifest.from_json(_with(change))


def test_numbers_widen_as_in_json_and_nothing_else_is_converted(tmp_path: Path) -> None:
    read = Manifest.from_json(_with({"stats": {"x": 1}, "dropped_raw_reward": [2, None]}))
    assert read.stats == {"x": 1.0} and type(read.stats["x"]) is float
    assert read.dropped_raw_reward == [2.0, None]
    with pytest.raises(TypeError):  # a numpy integer never reaches manifest.json
        manifest().replace(step=np.int64(3)).to_json()
    outputs = [OutputFile(path="rank=0.parquet", sha256="x", rows=np.int32(2))]  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        manifest().replace(outputs=outputs).write(tmp_path / "manifest.json")


def test_a_shape_error_names_each_field_on_one_line() -> None:
    with pytest.raises(ShapeError) as excinfo:
        Manifest.from_json(_with({"step": "3", "counts.extra": 1}))
    assert str(excinfo.value) == (
        "step: Input should be a valid integer; counts.extra: Unexpected keyword argument"
    )
    with pytest.raises(ShapeError, match="^Manifest: Invalid JSON"):
        Manifest.from_json("{not json")


def test_writing_a_manifest_does_not_load_pydantic(tmp_path: Path) -> None:
    """A build writes its manifest from the dataclasses alone; pydantic loads to read one."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.support.manifests import manifest\n"
        "manifest().write(Path(sys.argv[1]))\n"
        "print('pydantic' in sys.modules)\n"
    )
    run = [sys.executable, "-c", script, str(tmp_path / "manifest.json")]
    result = subprocess.run(run, capture_output=True, text=True, check=True)
    assert result.stdout == "False\n"
    assert manifest_at(tmp_path / "manifest.json") == manifest()


def test_the_json_keeps_its_bytes() -> None:
    """Field order, two-space indent, floats as JSON floats: a folder built before the
    manifest's records became dataclasses read by pydantic is still current."""
    text = manifest().replace(stats={"rollout/raw_reward": 1.0}).to_json()
    assert text.startswith(
        '{\n  "step": 3,\n  "settings": {\n    "global_batch_size": 4,\n    "dp_size": 2\n  },\n'
        '  "inputs": [\n    {\n      "path": "in/step=3.parquet",\n'
    )
    assert '"stats": {\n    "rollout/raw_reward": 1.0\n  },' in text
    assert '  "dropped_raw_reward": [\n    null,\n    1.5\n  ],\n  "report": null,\n' in text
    assert text.endswith('  "report": null,\n  "manifest_sha256": "' + text[-68:])
    assert list(json.loads(text)) == [f.name for f in dataclasses.fields(Manifest)]


def test_the_manifest_is_sealed_by_its_digest() -> None:
    """`manifest_sha256` is the sha256 of the other fields' JSON (sorted keys, compact,
    ASCII), taken again from the JSON as read, as the loader does; reading a manifest
    and writing it again gives the same seal."""
    text = manifest().replace(stats={"rollout/raw_reward": 0.1, "x": float("nan")}).to_json()
    data = json.loads(text)
    seal = data.pop("manifest_sha256")
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert seal == hashlib.sha256(canonical.encode()).hexdigest()
    assert Manifest.from_json(text).to_json() == text
    changed = manifest().replace(settings={"global_batch_size": 4, "dp_size": 1})
    assert json.loads(changed.to_json())["manifest_sha256"] != seal
