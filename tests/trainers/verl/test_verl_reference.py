"""The per-sample verl reference (tests/reference.py) against verl 0.9.1's own trainer
path on CPU (tests/support/verl.py): every batch tensor equal by value, dtype and
shape, uid and global_token_num equal, on every rank, across the issue's cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.reference import verl_reference
from tests.support.verl import case_rows, trainer_ranks

CASES = [
    # (dp, n, groups, balance, std, extra)
    (1, 1, 4, False, True, {}),
    (2, 4, 4, True, True, {}),
    (4, 4, 4, True, False, {}),
    (4, 8, 3, True, True, {"log_probs": False}),
    (2, 8, 2, False, False, {"pad_token_id": 151643}),
    (4, 1, 8, True, True, {"full": True}),
    (1, 8, 2, True, True, {"full": True, "log_probs": False}),
    (2, 1, 6, False, True, {"pad_token_id": 0}),
    (2, 16, 2, True, True, {}),
    (1, 5, 3, True, True, {}),
    (4, 24, 2, False, True, {}),
]


def verl_settings(dp: int, n: int, balance: bool, std: bool, **extra: Any) -> dict[str, Any]:
    return {
        "dp_size": dp,
        "rollout_n": n,
        "balance_batch": balance,
        "norm_adv_by_std_in_grpo": std,
        "max_prompt_length": 6,
        "max_response_length": 7,
        "pad_token_id": extra.get("pad_token_id", 2),
    }


def assert_same_rank(verl_rank: Any, expected: dict[str, Any]) -> None:
    batch = verl_rank.batch
    assert sorted(batch.keys()) == sorted(expected["batch"])
    for key, want in expected["batch"].items():
        got = batch[key].numpy()
        assert got.dtype == want.dtype and got.shape == want.shape, key
        # bits, so -0.0 and 0.0 (and every float32 rounding) count
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), key
    assert list(verl_rank.non_tensor_batch) == ["uid"]
    uid = verl_rank.non_tensor_batch["uid"]
    assert uid.dtype == object and uid.tolist() == expected["uid"]
    assert all(type(u) is str for u in uid)
    assert verl_rank.meta_info["global_token_num"] == expected["global_token_num"]


@pytest.mark.parametrize(("dp", "n", "groups", "balance", "std", "extra"), CASES)
def test_reference_is_verl(
    dp: int, n: int, groups: int, balance: bool, std: bool, extra: dict[str, Any]
) -> None:
    settings = verl_settings(dp, n, balance, std, **extra)
    rows = case_rows(
        groups=groups,
        n=n,
        seed=dp * 100 + n * 10 + groups,
        log_probs=extra.get("log_probs", True),
        full=extra.get("full", False),
    )
    got = trainer_ranks(rows, settings)
    want = verl_reference(rows, settings)
    assert len(got) == len(want) == dp
    for verl_rank, expected in zip(got, want, strict=True):
        assert_same_rank(verl_rank, expected)
