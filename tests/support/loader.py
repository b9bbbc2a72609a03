"""Expected rank dicts from the per-sample reference, and a bitwise comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.feather as feather
import pyarrow.parquet as pq

from tests.reference import micro_batch_runs, miles_rank_dict, reference_build
from tests.support.samples import sample

# The packages of a miles environment the loader and the CLI are installed into
# (tests/e2e/test_installs.py).
MILES_PINS = ["polars==1.42.1", "numpy", "pyarrow"]


def rewrite_manifest(folder: Path, manifest: dict[str, Any], seal: bool = True) -> None:
    """Write `manifest` as the step folder's, sealed by its own `manifest_sha256` as a build
    seals one (`seal`), or without the seal, as a build wrote it before the seal existed."""
    from rollout_shards_loader._manifest import manifest_sha256

    manifest = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if seal:
        manifest["manifest_sha256"] = manifest_sha256(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def bits(value: Any) -> Any:
    """`value` with every float as its hex (bit for bit) and every type made visible."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, list):
        return [bits(v) for v in value]
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    return (type(value).__name__, value)


def assert_same_dict(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want), f"keys {list(got)} != {list(want)}"
    for key in want:
        assert bits(got[key]) == bits(want[key]), key


def expected_rank_dicts(
    rows: list[dict[str, Any]], settings: dict[str, Any], folder: Path
) -> list[dict[str, Any]]:
    """Each rank's dict from the reference: values per sample from `reference_build`;
    without balance_data or the schedule also the strided ranks from it, otherwise the
    partitions (and the schedule's micro-batches) as the step folder lays them out."""
    manifest = json.loads((folder / "manifest.json").read_text())
    plain = {k: v for k, v in settings.items() if k not in SCHEDULE_SETTINGS}
    laid_out = bool(settings.get("balance_data")) or manifest["num_microbatches"] is not None
    result = reference_build([dict(r) for r in rows], plain, step_ranks=not laid_out)
    batch = sorted((row for rank in result["ranks"] for row in rank), key=_position)
    dp = manifest["settings"]["dp_size"]
    files = [pq.read_table(folder / f"rank={r}.parquet").to_pydict() for r in range(dp)]
    want = []
    for rank in range(dp):
        if laid_out:
            partition = files[rank]["batch_position"]
        else:
            partition = [row["batch_position"] for row in result["ranks"][rank]]
        schedule = None
        if manifest["num_microbatches"] is not None:
            schedule = {
                "num_microbatches": manifest["num_microbatches"],
                "micro_batch_indices": micro_batch_runs(
                    files[rank]["train_step"], files[rank]["micro_batch"]
                ),
                "num_rollouts": manifest["num_rollouts"],
            }
        want.append(
            miles_rank_dict(
                batch,
                partition,
                dynamic_global_batch_size=result["dynamic_global_batch_size"],
                schedule=schedule,
            )
        )
    return want


SCHEDULE_SETTINGS = (
    "cp_size",
    "micro_batch_size",
    "use_dynamic_batch_size",
    "max_tokens_per_gpu",
    "vpp_size",
    "microbatch_group_size_per_vp_stage",
    "allow_partial_train_step",
    "balance_data",
)


def _position(row: dict[str, Any]) -> int:
    return row["batch_position"]


def numpy_as_python(data: dict[str, Any]) -> dict[str, Any]:
    """A `read_rank(..., as_numpy=True)` dict turned into Python lists the documented way
    (numpy `tolist`, ragged keys cut at their offsets), to compare with the plain dict."""
    import numpy as np
    from rollout_shards_loader import Ragged

    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Ragged):
            assert value.offsets.dtype == np.int64 and value.offsets[0] == 0, key
            assert len(value.offsets) == len(data["total_lengths"]) + 1, key
            out[key] = value.tolist(null_empty=key == "weight_versions")
        elif isinstance(value, np.ndarray):
            out[key] = value.tolist()
        else:
            out[key] = value
    return out


def refuse_step(tmp_path: Path, out: Path, step: int = 2) -> Path:
    """Build step `step` of rows one of which has a NaN reward into `out`: refused, so the
    root holds `_refused/step=<step>.json`; returns the step folder that never comes."""
    import pytest

    from pipeline.errors import StepError
    from tests.support.samples import build, sample, write_step

    rows = [sample(i, reward=float("nan") if i == 1 else 1.0) for i in range(4)]
    write_step(tmp_path / f"bad-{step}", rows, step=step)
    with pytest.raises(StepError):
        build(tmp_path / f"bad-{step}", out, global_batch_size=2, dp_size=2)
    assert (out / "_refused" / f"step={step}.json").is_file()
    return out / f"step={step}"


def rows_with_extras(n: int) -> list[dict[str, Any]]:
    return [
        sample(
            i,
            reward=float(i % 3) * 0.7,
            group_index=i // 4,
            response_length=1 + i % 3,
            rollout_log_probs=[-0.1 * (k + 1) for k in range(1 + i % 3)],
            round_number=i // 5,
            weight_versions=["v1"] if i % 2 else None,
            train_metadata=json.dumps({"i": i}),
            status="truncated" if i % 4 == 3 else "completed",
        )
        for i in range(n)
    ]


WORKED = {
    # trimmed steps: rows in prompt groups of two the trims keep whole (SEMANTICS 5.4)
    "dynamic_13_rows_dp4": (
        [sample(i, group_index=i // 2, reward=float(i)) for i in range(13)],
        {"global_batch_size": 4, "dp_size": 4, "use_dynamic_global_batch_size": True},
    ),
    "trim_11_to_8": (
        [sample(i, group_index=i // 2, reward=float(i)) for i in range(11)],
        {"global_batch_size": 4},
    ),
    "trim_disabled_11_untrained": (
        [sample(i) for i in range(11)],
        {"global_batch_size": 4, "disable_rollout_trim_samples": True},
    ),
    "masks": (
        [
            sample(0, response_length=5),
            sample(1, response_length=3, remove_sample=True),
            sample(2, response_length=4, loss_mask=[1, 0, 1, 0]),
        ],
        {"global_batch_size": 1},
    ),
    "rewards_groups_std": (
        [
            sample(i, reward=r, group_index=g)
            for i, (r, g) in enumerate([(0, 0), (0, 1), (2, 0), (4, 1)])
        ],
        {"global_batch_size": 2, "dp_size": 2},
    ),
    "compact_mask_sums": (
        [
            sample(0, 0, session_version="v2", rollout_id=0, response_length=2),
            sample(0, 1, session_version="v2", rollout_id=0, response_length=3),
            sample(1, session_version="v2", response_length=4),
            sample(2, session_version="v2"),
        ],
        {"global_batch_size": 2, "dp_size": 2},
    ),
    "optional_columns": (rows_with_extras(12), {"global_batch_size": 4, "dp_size": 2}),
    "ppo": (
        [sample(i, reward=0.25 * i) for i in range(4)],
        {"global_batch_size": 2, "advantage_estimator": "ppo"},
    ),
}


def read_rows(source: Path) -> list[dict[str, Any]]:
    """Input rows read the plain way, independent of the pipeline's readers."""
    files = sorted(source.iterdir()) if source.is_dir() else [source]
    rows: list[dict[str, Any]] = []
    for path in files:
        if path.suffix == ".jsonl":
            rows += [json.loads(line) for line in path.read_text().splitlines() if line]
        elif path.suffix == ".parquet":
            rows += pq.read_table(path).to_pylist()
        else:
            rows += feather.read_table(path).to_pylist()
    return rows
