"""The embedded sample data under data/rollouts: small, deterministic, one case per step.

step 1  plain GRPO groups (no session server), truncated/aborted rows, remove_sample,
        explicit and null loss masks, rollout log probs                       (Parquet)
step 2  session v1 agentic rows, weight versions and train metadata; 11 rows (IPC)
step 3  session v2 with multi-leaf trajectories: a compact batch, in two files (JSONL)
step 4  session v2 singletons only (trimmed like v1), a struct reward read
        through reward_key `score`                                           (Parquet)

Run `python -m pipeline.sample_data data/rollouts` to write it again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipeline.columns import INPUT_SCHEMA

SEED = 2536
SETTINGS = "rollout-shards.yaml"
SETTINGS_TEXT = """\
# Settings the embedded sample data is meant for; read beneath --config and flags.
global_batch_size: 8
dp_size: 2
reward_key: score
"""


def _sample(rng: np.random.Generator, index: int, leaf: int, **fields: object) -> dict[str, Any]:
    prompt_len = int(rng.integers(4, 12))
    response_len = int(rng.integers(2, 16))
    row = {
        "group_index": index // 4,
        "index": index,
        "leaf": leaf,
        "rollout_id": None,
        "session_version": None,
        "status": "completed",
        "tokens": rng.integers(1, 32000, prompt_len + response_len).tolist(),
        "response_length": response_len,
        "loss_mask": None,
        "reward": float(rng.integers(0, 2)),
        "remove_sample": False,
    }
    row.update(fields)
    return row


def plain_grpo(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = [_sample(rng, i, 0) for i in range(16)]
    rows[2]["status"] = "truncated"
    rows[5].update(status="aborted", reward=0.0)
    rows[9]["remove_sample"] = True
    for row in rows[::3]:
        row["loss_mask"] = [int(b) for b in rng.integers(0, 2, row["response_length"])]
    for row in rows:
        row["rollout_log_probs"] = (-rng.random(row["response_length"])).round(4).tolist()
    return rows


def v1_agentic(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = [_sample(rng, 100 + i, 0, session_version="v1") for i in range(11)]
    rows[4]["status"] = "truncated"
    for i, row in enumerate(rows):
        row["weight_versions"] = [f"w{3 + i % 2}"]
        row["train_metadata"] = json.dumps({"turns": 1 + i % 3})
    return rows


def v2_multi_leaf(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Eight rollouts: five multi-leaf trajectories (stamped ids) and three singletons."""
    leaves = {200: 3, 201: 1, 202: 2, 203: 1, 204: 4, 205: 2, 206: 1, 207: 2}
    input_ids = {202: 9202}  # an input sample that already carried a rollout id
    rows = []
    for index, count in leaves.items():
        reward = float(rng.integers(0, 3)) / 2
        stamp = input_ids.get(index, index) if count > 1 else None
        for leaf in range(count):
            rows.append(
                _sample(
                    rng,
                    index,
                    leaf,
                    session_version="v2",
                    rollout_id=stamp,
                    reward=reward,
                    group_index=(index - 200) // 4,
                )
            )
    rows[3]["status"] = "truncated"
    rows[-1].update(status="aborted", remove_sample=True)
    return rows


def v2_singletons(rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for i in range(13):
        score = float(rng.integers(0, 5)) / 4
        rows.append(
            _sample(
                rng,
                300 + i,
                0,
                session_version="v2",
                reward={"score": score, "format": float(rng.integers(0, 2))},
            )
        )
    rows[7]["status"] = "truncated"
    return rows


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    columns = {name: [row.get(name) for row in rows] for name in rows[0]}
    schema = {name: INPUT_SCHEMA[name] for name in columns if name in INPUT_SCHEMA}
    frame = pl.DataFrame(
        {k: v for k, v in columns.items() if k in schema}, schema=schema, strict=False
    )
    if "reward" in columns:
        frame = frame.with_columns(pl.Series("reward", columns["reward"]))
    return frame.select(list(columns))


def write_sample_data(root: Path) -> list[Path]:
    rng = np.random.default_rng(SEED)
    root.mkdir(parents=True, exist_ok=True)
    step3 = v2_multi_leaf(rng)
    written = []
    _frame(plain_grpo(rng)).write_parquet(root / "step=1.parquet")
    _frame(v1_agentic(rng)).write_ipc(root / "step=2.arrow")
    (root / "step=3").mkdir(exist_ok=True)
    for part, chunk in enumerate((step3[:9], step3[9:])):
        path = root / "step=3" / f"part-{part}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in chunk))
    _frame(v2_singletons(rng)).write_parquet(root / "step=4.parquet")
    (root / SETTINGS).write_text(SETTINGS_TEXT)
    written = sorted(p for p in root.rglob("*") if p.is_file())
    return written


if __name__ == "__main__":
    for path in write_sample_data(Path(sys.argv[1] if len(sys.argv) > 1 else "data/rollouts")):
        print(path)
