"""rollout_shards_loader.verl.read_rank against verl 0.9.1's own trainer path on CPU
(tests/support/verl.py): the same rows built with `--trainer verl` and read back give,
on every rank, the DataProto `DataProto.chunk` hands that rank: every batch tensor equal by
torch.equal with the same dtype and shape (and the same bits), `non_tensor_batch` exactly
{"uid": ...} of str in the same order, `meta_info["global_token_num"]` equal."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader.verl import read_rank

from tests.support.samples import build, write_step
from tests.support.verl import assert_same, case_rows, trainer_ranks, verl_modules

# every dp x n pair; balance, std normalization, full-length rows, log probs and the pad id
# take both values across them, and the last pair runs all four balance x std combinations
PAIRS = list(itertools.product((1, 2, 4), (1, 4, 8)))
CASES = (
    [
        {
            "dp": dp,
            "n": n,
            "balance": i % 2 == 0,
            "std": i // 2 % 2 == 0,
            "full": i % 3 == 2,
            "log_probs": i % 4 != 3,
            "pad": (0, 151643)[i // 3 % 2],
        }
        for i, (dp, n) in enumerate(PAIRS)
    ]
    + [
        {"dp": 4, "n": 8, "balance": b, "std": s, "full": False, "log_probs": True, "pad": 7}
        for b, s in ((True, True), (False, True), (True, False))
    ]
    + [
        # torch's float32 sums change order past 8 values a group, and with odd sizes
        {"dp": 2, "n": n, "balance": True, "std": True, "full": False, "log_probs": True, "pad": 0}
        for n in (5, 16)
    ]
)


def _id(case: dict[str, Any]) -> str:
    flags = [k for k in ("balance", "std", "full", "log_probs") if case[k]]
    return f"dp{case['dp']}-n{case['n']}-pad{case['pad']}-" + "-".join(flags)


def verl_settings(case: dict[str, Any], groups: int) -> dict[str, Any]:
    return {
        "trainer": "verl",
        "dp_size": case["dp"],
        "rollout_n": case["n"],
        "train_batch_size": groups,
        "max_prompt_length": 6,
        "max_response_length": 7,
        "pad_token_id": case["pad"],
        "balance_batch": case["balance"],
        "norm_adv_by_std_in_grpo": case["std"],
    }


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_read_rank_is_verls_chunk(tmp_path: Path, case: dict[str, Any]) -> None:
    groups = {1: 8, 16: 2}.get(case["n"], 4)
    rows = case_rows(
        groups=groups,
        n=case["n"],
        seed=len(_id(case)) + case["dp"] * 7 + case["n"],
        log_probs=case["log_probs"],
        full=case["full"],
    )
    settings = verl_settings(case, groups)
    write_step(tmp_path / "in", rows)
    manifest = build(tmp_path / "in", tmp_path / "out", **settings)
    assert manifest["settings"]["trainer"] == "verl"
    want = trainer_ranks(rows, {**settings, "rollout_n": case["n"]})
    for rank in range(case["dp"]):
        assert_same(read_rank(tmp_path / "out" / "step=1", rank), want[rank])


def test_each_trainers_reader_refuses_the_others_step(tmp_path: Path) -> None:
    import rollout_shards_loader
    from rollout_shards_loader import ShardVerificationError, read_manifest

    verl_modules()  # verl as the trainer's environment has it
    rows = case_rows(groups=2, n=4, seed=3)
    write_step(tmp_path / "in", rows)
    case = {"dp": 2, "n": 4, "pad": 0, "balance": True, "std": True}
    build(tmp_path / "in", tmp_path / "verl", **verl_settings(case, 2))
    build(tmp_path / "in", tmp_path / "miles", global_batch_size=8, dp_size=2)
    verl_step, miles_step = tmp_path / "verl" / "step=1", tmp_path / "miles" / "step=1"
    assert read_manifest(verl_step)["settings"]["trainer"] == "verl"
    with pytest.raises(ValueError, match="rollout_shards_loader.verl.read_rank"):
        rollout_shards_loader.read_rank(verl_step, 0)
    with pytest.raises(
        ValueError, match=r"built for the miles trainer \(--trainer miles\), not verl"
    ):
        read_rank(miles_step, 0)
    with pytest.raises(ValueError, match="rank=2 is outside the step.s dp_size=2 ranks"):
        read_rank(verl_step, 2)
    assert len(read_rank(verl_step, 0, verify=False)) == 4
    other = verl_step / "rank=1.parquet"
    other.chmod(0o644)
    other.write_bytes(other.read_bytes()[:-1] + b"!")
    with pytest.raises(ShardVerificationError, match="rank=1.parquet: its sha256"):
        read_rank(verl_step, 0)
