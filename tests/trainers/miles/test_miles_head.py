"""rollout_shards_loader.miles against miles' own code (tests/support/miles.py):
miles HEAD's rollout side turns the rows into per-rank refs, its `MegatronTrainRayActor.train()`
(with `--debug-rollout-only`) takes them, and the same `train()` with the hook installed
reads the built step folder instead. The dicts `train()` holds, and everything the trainer
derives from them (advantages and returns, `get_data_iterator`'s schedule, every
micro-batch `get_batch` builds), must be the same, tensors and floats bit for bit."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import StepNotBuiltError, read_rank
from rollout_shards_loader import _hook as hook_internals
from rollout_shards_loader import miles as hook

from pipeline.settings import load_settings
from tests.support import miles as ms
from tests.support.loader import WORKED, read_rows, rows_with_extras
from tests.support.miles_hook import NoAllReduce, both_paths
from tests.support.samples import REPO, build, dropped_rollout_rows, sample, write_step


@pytest.fixture(scope="module")
def miles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    source = ms.head_source(tmp_path_factory.mktemp("miles"))
    with ms.miles_modules(source) as modules:
        yield modules


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    hook.uninstall()


CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    **WORKED,
    "balanced": (
        [sample(i, response_length=n, reward=float(n)) for i, n in enumerate([9, 1, 8, 2, 7, 3])]
        + [sample(6, response_length=6, reward=6.0), sample(7, response_length=4, reward=4.0)],
        {"global_batch_size": 4, "dp_size": 2, "balance_data": True},
    ),
    "scheduled_dynamic_micro_batches": (
        dropped_rollout_rows(),
        {
            "global_batch_size": 2,
            "dp_size": 2,
            "cp_size": 1,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 8,
        },
    ),
    "scheduled_static_balanced": (
        dropped_rollout_rows(),
        {
            "global_batch_size": 2,
            "dp_size": 2,
            "cp_size": 1,
            "micro_batch_size": 1,
            "balance_data": True,
        },
    ),
    "trainer_dynamic_micro_batches": (
        [sample(i, response_length=1 + i % 4, reward=float(i % 2)) for i in range(8)],
        {
            "global_batch_size": 4,
            "dp_size": 2,
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": 9,
        },
    ),
    "two_steps_per_rank_extras": (
        rows_with_extras(16),
        {"global_batch_size": 4, "dp_size": 2, "micro_batch_size": 2},
    ),
}


# Every model flag given, so that miles' args (the settings as they are) hold what
# Megatron's parser would: balance_by_flops reads them all.
_SHAPE = {
    "num_layers": 2,
    "hidden_size": 32,
    "ffn_hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 8,
    "vocab_size": 100,
    "kv_lora_rank": 32,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
}
_BY_FLOPS = {
    "global_batch_size": 4,
    "dp_size": 2,
    "cp_size": 1,
    "use_dynamic_batch_size": True,
    "max_tokens_per_gpu": 60,
    "balance_by_flops": True,
}
_SHAPES = {
    "gqa": _SHAPE,
    "moe": {
        **_SHAPE,
        "num_experts": 4,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 16,
        "moe_layer_freq": [0, 1],
    },
    "mla_q_lora": {
        **_SHAPE,
        "q_lora_rank": 8,
        "kv_lora_rank": 8,
        "qk_head_dim": 8,
        "qk_pos_emb_head_dim": 4,
        "v_head_dim": 8,
    },
}


def _uneven_rows() -> list[dict[str, Any]]:
    lengths = [1, 40, 3, 90, 7, 12, 60, 2, 33, 5, 70, 9]
    return [sample(i, response_length=n, reward=float(i % 3)) for i, n in enumerate(lengths)]


CASES.update(
    {
        f"scheduled_by_flops_{name}": (_uneven_rows(), {**_BY_FLOPS, **shape})
        for name, shape in _SHAPES.items()
    }
)
# The four shapes of issue 46 (rank membership and order differed from miles' there):
# every model flag a real run gives, the rest as Megatron's parser leaves it.
_ISSUE_MODEL = {**_SHAPE, "num_layers": 8}
_ISSUE_SHAPES: dict[str, dict[str, Any]] = {
    "moe_pattern_shared_expert": {
        **_BY_FLOPS,
        **_ISSUE_MODEL,
        "num_experts": 4,
        "moe_ffn_hidden_size": 16,
        "moe_router_topk": 2,
        "moe_layer_freq": [0, 1, 1, 1, 0, 1, 1, 1],
        "moe_shared_expert_intermediate_size": 1024,
    },
    "moe_every_2nd_layer_dp8_cp2": {
        **_BY_FLOPS,
        **_ISSUE_MODEL,
        "global_batch_size": 8,
        "dp_size": 8,
        "cp_size": 2,
        "max_tokens_per_gpu": 30,
        "num_experts": 4,
        "moe_ffn_hidden_size": 16,
        "moe_router_topk": 2,
        "moe_layer_freq": 2,
    },
    "dense_vpp_microbatch_groups": {
        **_BY_FLOPS,
        **_ISSUE_MODEL,
        "global_batch_size": 8,
        "dp_size": 4,
        "vpp_size": 2,
        "microbatch_group_size_per_vp_stage": 2,
    },
    "dynamic_global_batch_moe": {
        **_BY_FLOPS,
        **_ISSUE_MODEL,
        "dp_size": 4,
        "use_dynamic_global_batch_size": True,
        "num_experts": 128,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 64,
        "moe_layer_freq": 1,
    },
}
# prompt groups of two rows, which the trims to global batches of 8 keep whole
_PROMPT_ROWS = [dict(row, group_index=row["index"] // 2) for row in _uneven_rows()]
CASES.update({f"by_flops_{name}": (_PROMPT_ROWS, chosen) for name, chosen in _ISSUE_SHAPES.items()})
CASES["delayed_split_with_cp_size"] = (
    _uneven_rows(),
    {**_BY_FLOPS, **_SHAPE, "balance_data": True, "delay_split_train_data_by_dp": True},
)
CASES["scheduled_by_flops_compact"] = (
    dropped_rollout_rows(),
    {**_BY_FLOPS, **_SHAPE, "global_batch_size": 2, "max_tokens_per_gpu": 8},
)


def _embedded_cases() -> dict[str, tuple[Path, dict[str, Any]]]:
    data = REPO / "data" / "rollouts"
    return {
        source.name: (source, {"global_batch_size": 8, "dp_size": 2, "reward_key": "score"})
        for source in sorted(data.iterdir())
        if source.name.startswith("step=")
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_hook_feeds_train_what_miles_own_conversion_does(
    miles: Any, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, chosen = CASES[case]
    monkeypatch.setattr(miles.data, "GeneralPGUtil", NoAllReduce)
    write_step(tmp_path / "in", rows, step=3)
    build(tmp_path / "in", tmp_path / "out", **chosen)
    both_paths(miles, rows, chosen, tmp_path / "out", rollout_id=3)


@pytest.mark.parametrize("name", sorted(_embedded_cases()))
def test_embedded_data_steps(miles: Any, name: str, tmp_path: Path) -> None:
    source, chosen = _embedded_cases()[name]
    step = int(name.split("=")[1].split(".")[0])
    (tmp_path / "in").mkdir()
    (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / "in" / source.name)
    build(tmp_path / "in", tmp_path / "out", **chosen)
    both_paths(miles, read_rows(source), chosen, tmp_path / "out", rollout_id=step)


def test_head_gets_the_pair_and_enters_its_handle(miles: Any, tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i, reward=float(i)) for i in range(4)])
    build(tmp_path / "in", tmp_path / "out", global_batch_size=2, dp_size=2)
    hook.install(tmp_path / "out")
    token = hook_internals._ROLLOUT_ID.set(1)
    try:
        data, handle = miles.data.process_rollout_data(
            ms.Args(global_batch_size=2), None, 1, 2, witness_info=None
        )
    finally:
        hook_internals._ROLLOUT_ID.reset(token)
    assert isinstance(handle, miles.object_store.ObjectStoreGetResult)
    with handle as value:
        assert value is data
    assert data == read_rank(tmp_path / "out" / "step=1", 1)


def test_install_after_ray_took_train_raises_at_the_first_train(miles: Any, tmp_path: Path) -> None:
    """Ray keeps the method it found when it loaded the class: one taken before `install`
    must not train on the rollout side's batch."""
    rows = [sample(i, reward=float(i)) for i in range(4)]
    write_step(tmp_path / "in", rows)
    build(tmp_path / "in", tmp_path / "out", global_batch_size=2, dp_size=2)
    settings = load_settings(global_batch_size=2, dp_size=2).to_dict()
    args = ms.miles_args(settings)
    refs = ms.rollout_side(miles, args, rows, ms.train_parallel_config(settings))
    taken_by_ray = miles.actor.MegatronTrainRayActor.train
    hook.install(tmp_path / "out")
    actor, seen = ms.trainer(miles, args)
    ms.set_rank(miles, 0, settings)
    with pytest.raises(hook.LateInstallError, match="worker_process_setup_hook"):
        taken_by_ray(actor, 1, refs)
    assert seen == []
    actor.train(1, refs)  # the class's own, wrapped, reads the step
    assert seen[0]["sample_indices"] == [0, 2]


def test_runtime_env_runs_the_setup_hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = hook.runtime_env(tmp_path, {"env_vars": {"A": "1"}})
    assert env == {
        "env_vars": {"A": "1", hook.ROOT_ENV: str(tmp_path)},
        "worker_process_setup_hook": "rollout_shards_loader.miles.setup_hook",
    }
    with pytest.raises(ValueError, match="already has a worker_process_setup_hook"):
        hook.runtime_env(tmp_path, {"worker_process_setup_hook": "x.y"})
    monkeypatch.delenv(hook.ROOT_ENV, raising=False)
    with pytest.raises(RuntimeError, match=hook.ROOT_ENV):
        hook.setup_hook()
    monkeypatch.setenv(hook.ROOT_ENV, str(tmp_path))
    hook.setup_hook()
    assert hook_internals._Finder.root == tmp_path


def _trainer_on_a_step(miles: Any, tmp_path: Path) -> tuple[Any, Any, list[dict[str, Any]]]:
    """miles' trainer for rank 0 of a dp-2 run, the rollout side's refs, and what its
    `train()` holds; the step itself is built into `tmp_path / "built"`."""
    rows = [sample(i, reward=float(i)) for i in range(4)]
    write_step(tmp_path / "in", rows, step=3)
    build(tmp_path / "in", tmp_path / "built", global_batch_size=2, dp_size=2)
    settings = load_settings(global_batch_size=2, dp_size=2).to_dict()
    args = ms.miles_args(settings)
    refs = ms.rollout_side(miles, args, rows, ms.train_parallel_config(settings))
    actor, seen = ms.trainer(miles, args)
    ms.set_rank(miles, 0, settings)
    return actor, refs, seen


def test_train_waits_for_a_step_built_alongside(miles: Any, tmp_path: Path) -> None:
    """Training alongside the build: `train(3)` before step 3 is committed waits for its
    manifest and then trains on it."""
    actor, refs, seen = _trainer_on_a_step(miles, tmp_path)
    (tmp_path / "out").mkdir()
    commit = threading.Timer(
        0.5, os.rename, (tmp_path / "built" / "step=3", tmp_path / "out" / "step=3")
    )
    hook.install(tmp_path / "out", wait_s=60)
    started = time.monotonic()
    commit.start()
    try:
        actor.train(3, refs)
    finally:
        commit.join()
    assert time.monotonic() - started >= 0.5
    assert seen[0]["sample_indices"] == [0, 2]


def test_train_on_a_step_never_built_fails_naming_the_build(
    miles: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No build commits step 3: after the wait (here from the environment, as a Ray job's
    runtime env sets it) `train(3)` fails with one line naming the command that builds it."""
    actor, refs, seen = _trainer_on_a_step(miles, tmp_path)
    monkeypatch.setenv(hook.WAIT_ENV, "0.2")
    hook.install(tmp_path / "out")
    started = time.monotonic()
    with pytest.raises(StepNotBuiltError) as failure:
        actor.train(3, refs)
    assert time.monotonic() - started >= 0.2
    message = str(failure.value)
    assert "\n" not in message and "waiting 0.2 s" in message
    assert (
        f"rollout-shards build <the rollouts folder holding step=3> --out {tmp_path / 'out'}`"
        in message
    )
    assert seen == []


def test_train_on_a_refused_step_fails_at_once_quoting_the_rule(miles: Any, tmp_path: Path) -> None:
    """The build refused step 3: `train(3)` fails within a second, not after its 600 s
    wait, with the rule and the command that shows the whole refusal."""
    from rollout_shards_loader import StepRefusedError

    from tests.support.loader import refuse_step

    actor, refs, seen = _trainer_on_a_step(miles, tmp_path)
    refuse_step(tmp_path, tmp_path / "out", step=3)
    hook.install(tmp_path / "out", wait_s=600)
    started = time.monotonic()
    with pytest.raises(StepRefusedError, match="rule reward_finite") as failure:
        actor.train(3, refs)
    assert time.monotonic() - started < 1
    assert f"`rollout-shards validate {tmp_path / 'out'}` shows it all" in str(failure.value)
    assert seen == []


def test_the_wait_is_a_number_of_seconds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert hook.runtime_env(tmp_path, wait_s=30)["env_vars"][hook.WAIT_ENV] == "30.0"
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(hook.WAIT_ENV, bad)
        with pytest.raises(ValueError, match=f"{hook.WAIT_ENV}='{bad}': the wait for a step"):
            hook.install(tmp_path)
    monkeypatch.delenv(hook.WAIT_ENV)
    with pytest.raises(ValueError, match="wait_s=True"):
        hook.install(tmp_path, wait_s=True)
    hook.install(tmp_path)
    assert hook_internals._Finder.wait_s == hook.WAIT_S
