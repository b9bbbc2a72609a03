"""Hypothesis strategies: rollout tables of every session kind, and settings to build them."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

KINDS = ("plain", "v1", "v2_multi", "v2_single")


@st.composite
def trajectories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid step: trajectories of every kind, siblings sharing id and reward."""
    count = draw(st.integers(1, 14))
    with_groups = draw(st.booleans())
    with_log_probs = draw(st.booleans())
    struct_reward = draw(st.booleans())
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=count, max_size=count))
    rows = []
    for index, kind in enumerate(kinds):
        leaves = draw(st.integers(2, 4)) if kind == "v2_multi" else 1
        reward = draw(st.sampled_from([0.0, 0.5, 1.0, 0.7, -2.0, 3.25]))
        stamp = draw(st.sampled_from([index, 1000 + index])) if kind == "v2_multi" else None
        session = {"plain": None, "v1": "v1"}.get(kind, "v2")
        group = draw(st.integers(0, 3))
        for leaf in range(leaves):
            response = draw(st.integers(0, 5))
            prompt = draw(st.integers(1, 3))
            mask = draw(
                st.one_of(
                    st.none(), st.lists(st.integers(0, 1), min_size=response, max_size=response)
                )
            )
            row = {
                "index": index,
                "leaf": leaf,
                "rollout_id": stamp,
                "session_version": session,
                "status": draw(st.sampled_from(["completed", "truncated", "aborted"])),
                "tokens": list(range(prompt + response)),
                "response_length": response,
                "loss_mask": mask,
                "reward": {"score": reward, "format": float(leaf)} if struct_reward else reward,
                "remove_sample": draw(st.booleans()),
            }
            if with_groups:
                row["group_index"] = group
            if with_log_probs:
                row["rollout_log_probs"] = [-0.5 * (i + 1) for i in range(response)]
            rows.append(row)
    return rows


@st.composite
def build_settings(draw: st.DrawFn) -> dict[str, Any]:
    dp_size = draw(st.integers(1, 4))
    chosen = {
        "global_batch_size": dp_size * draw(st.integers(1, 4)),
        "dp_size": dp_size,
        "disable_rollout_trim_samples": draw(st.booleans()),
        "advantage_estimator": draw(
            st.sampled_from(["grpo", "gspo", "reinforce_plus_plus_baseline", "ppo"])
        ),
        "rewards_normalization": draw(st.booleans()),
        "grpo_std_normalization": draw(st.booleans()),
        "reward_key": "score",
    }
    if not chosen["disable_rollout_trim_samples"]:
        chosen["use_dynamic_global_batch_size"] = draw(st.booleans())
    if draw(st.booleans()):
        chosen["n_samples_per_prompt"] = draw(st.integers(1, 4))
        chosen["rollout_batch_size"] = draw(st.integers(1, 6))
    return chosen


@st.composite
def rollout_keys(draw: st.DrawFn, max_leaves: int) -> tuple[int, bool, list[int]]:
    """A batch's rollout key per row: 1 to 40 rollouts, each of 1 to `max_leaves` rows when
    the batch is compact (else one), in order or shuffled; with the rollout count and
    whether the batch is compact."""
    n_rollouts = draw(st.integers(1, 40))
    compact = draw(st.booleans())
    leaves = [draw(st.integers(1, max_leaves)) if compact else 1 for _ in range(n_rollouts)]
    keys = [rollout for rollout, count in enumerate(leaves) for _ in range(count)]
    if draw(st.booleans()):
        keys = [keys[i] for i in draw(st.permutations(range(len(keys))))]
    return n_rollouts, compact, keys


def by_flops(draw: st.DrawFn, vpp: int | None, top: int) -> dict[str, Any]:
    """balance_by_flops's settings over a vpp size: micro-batch groups when vpp is set, a
    token budget up to four of the longest rows (drawn in that order)."""
    return {
        "vpp_size": vpp,
        "microbatch_group_size_per_vp_stage": draw(st.integers(1, 3)) if vpp else None,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": draw(st.integers(1, 4 * top)),
        "balance_by_flops": True,
    }


def derandomized(max_examples: int, *checks: HealthCheck) -> settings:
    """Hypothesis settings of a drawn case that runs a build (or a trainer's code): the same
    examples on every run, no deadline, slow draws allowed, and `checks` left aside."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, *checks],
    )
