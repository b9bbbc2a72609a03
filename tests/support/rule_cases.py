"""One case per schema rule: the rows that break it, the words of its message, and the rows
(index, leaf) it names; shared by the rule tests and `validate`'s."""

from __future__ import annotations

from tests.support.samples import sample

V2 = {"session_version": "v2"}

CASES = [
    (
        "response_within_tokens",
        [sample(0), sample(1, tokens=[1, 2], response_length=3)],
        "response_length must be within 0..len(tokens)",
        [(1, 0)],
    ),
    (
        "loss_mask_length",
        [sample(0, response_length=3, loss_mask=[1, 1])],
        "loss_mask length must equal response_length",
        [(0, 0)],
    ),
    (
        "loss_mask_binary",
        [sample(0, response_length=2, loss_mask=[1, 2])],
        "loss_mask values must be 0 or 1",
        [(0, 0)],
    ),
    (
        "rollout_log_probs_length",
        [sample(0, response_length=2, rollout_log_probs=[-1.0])],
        "rollout_log_probs length must equal response_length",
        [(0, 0)],
    ),
    (
        "teacher_log_probs_length",
        [sample(0, response_length=2, teacher_log_probs=[-1.0, -1.0, -1.0])],
        "teacher_log_probs length must equal response_length",
        [(0, 0)],
    ),
    (
        "unique_leaf",
        [sample(0), sample(0)],
        "(step, index, leaf) must be unique",
        [(0, 0), (0, 0)],
    ),
    (
        "one_session_version",
        [sample(0, 0), sample(0, 1, session_version="v1")],
        "all leaves of a trajectory must have one session_version",
        [(0, 0), (0, 1)],
    ),
    (
        "rollout_id_only_on_v2_multi_leaf",
        [sample(0, session_version="v1", rollout_id=7), sample(1)],
        "rollout_id must be set exactly on the leaves of v2 multi-leaf trajectories",
        [(0, 0)],
    ),
    (
        "rollout_id_only_on_v2_multi_leaf",
        [sample(3, 0, **V2), sample(3, 1, **V2)],
        "v1 rows and v2 singletons keep it null; file row 1 has rollout_id null, "
        "session_version v2, leaves 2",
        [(3, 0), (3, 1)],
    ),
    (
        "reward_finite",
        [sample(0, reward=float("nan")), sample(1, reward=float("inf")), sample(2)],
        "reward must be a finite number on every row",
        [(0, 0), (1, 0)],
    ),
    (
        "rollout_log_probs_all_or_none",
        [sample(0, rollout_log_probs=[-1.0, -1.0]), sample(1)],
        "rollout_log_probs is null on some rows and set on others",
        [(1, 0)],
    ),
    (
        "teacher_log_probs_all_or_none",
        [sample(0), sample(1, teacher_log_probs=[-1.0, -1.0])],
        "teacher_log_probs is null on some rows and set on others",
        [(0, 0)],
    ),
    (
        "round_number_all_or_none",
        [sample(0, round_number=1), sample(1)],
        "round_number is null on some rows and set on others",
        [(1, 0)],
    ),
    (
        "train_metadata_all_or_none",
        [sample(0, train_metadata="{}"), sample(1)],
        "train_metadata is null on some rows and set on others",
        [(1, 0)],
    ),
    (
        "train_metadata_json_object",
        [
            sample(0, train_metadata='{"turns": 2}'),
            sample(1, train_metadata='{"turns": 2'),
            sample(2, train_metadata="[1, 2]"),
            sample(3, train_metadata='"{x}"'),
        ],
        "train_metadata must be a JSON object ({...})",
        [(1, 0), (2, 0), (3, 0)],
    ),
    (
        "status_isin",
        [sample(0, status="done")],
        "status must be one of pending, completed, truncated, aborted, failed",
        [(0, 0)],
    ),
    (
        "session_version_isin",
        [sample(0, session_version="v3")],
        "session_version must be v1, v2 or null",
        [(0, 0)],
    ),
    (
        "leaf_greater_than_or_equal_to",
        [sample(0, leaf=-1)],
        "leaf must be >= 0",
        [(0, -1)],
    ),
    (
        "response_length_greater_than_or_equal_to",
        [sample(0, response_length=-1, tokens=[1, 2])],
        "response_length must be >= 0",
        [(0, 0)],
    ),
    (
        "status_not_nullable",
        [sample(0, status=None)],
        "status must not be null",
        [(0, 0)],
    ),
]
