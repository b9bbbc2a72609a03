"""rollout_shards_loader.slime.install against slime's real Megatron actor code on CPU
(tests/support/slime.py): `MegatronTrainRayActor.train()` takes, through its own
`_get_rollout_data`, the refs slime's rollout side made of the rows; with the hook
installed the same `train()` reads the built step folder instead. What `train()` hands
`train_actor` must be the same both ways, tensors and floats bit for bit."""

from __future__ import annotations

import copy
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import miles as miles_hook
from rollout_shards_loader import slime as hook

from tests.support import slime as ss
from tests.support.samples import build, write_step
from tests.support.slime_cases import CASES


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    hook.uninstall()


def _trainer(m: Any, settings: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """A `MegatronTrainRayActor` as `init()` leaves it on a data-parallel rank (Megatron's
    parallel state answered by plain functions), and the dicts `train()` hands on."""
    actor = object.__new__(m.actor.MegatronTrainRayActor)
    actor.args = ss.slime_args(settings)
    actor.role = "actor"
    seen: list[dict[str, Any]] = []
    actor.train_actor = lambda rollout_id, rollout_data, external_data=None: seen.append(
        rollout_data
    )
    m.actor.accelerator = types.SimpleNamespace(current_device=lambda: "cpu")
    return actor, seen


def _set_rank(m: Any, rank: int, dp: int) -> None:
    mpu = m.actor.mpu
    mpu.get_data_parallel_rank = lambda with_context_parallel=False: rank
    mpu.get_data_parallel_world_size = lambda with_context_parallel=False: dp
    mpu.get_context_parallel_world_size = lambda: 1


@pytest.mark.parametrize("name", ["log_probs", "extras_round_raw_source", "balance_dynamic_moe"])
def test_train_takes_the_hook(slime: Any, tmp_path: Path, name: str) -> None:
    rows, settings = CASES[name]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    build(tmp_path / "in", tmp_path / "out", trainer="slime", **settings)
    refs, _flat = ss.rollout_side(slime, settings, copy.deepcopy(rows))
    dp = len(refs)
    actor, seen = _trainer(slime, settings)
    for rank in range(dp):
        _set_rank(slime, rank, dp)
        actor.train(1, refs)
    own = [ss.canonical(d) for d in seen]
    hook.install(tmp_path / "out")
    hooked, seen_hooked = _trainer(slime, settings)
    for rank in range(dp):
        _set_rank(slime, rank, dp)
        hooked.train(1, None)  # no refs: the data can only come from the step folder
    assert [ss.canonical(d) for d in seen_hooked] == own


def test_late_install_refuses(slime: Any, tmp_path: Path) -> None:
    rows, settings = CASES["dp1"]
    write_step(tmp_path / "in", copy.deepcopy(rows))
    build(tmp_path / "in", tmp_path / "out", trainer="slime", **settings)
    hook.install(tmp_path / "out")
    actor, _seen = _trainer(slime, settings)
    _set_rank(slime, 0, 1)
    with pytest.raises(miles_hook.LateInstallError, match="rollout_shards_loader.slime"):
        actor._get_rollout_data(None)  # a train() Ray loaded before the install


def test_runtime_env_names_slimes_setup_hook(tmp_path: Path) -> None:
    env = hook.runtime_env(tmp_path)
    assert env["worker_process_setup_hook"] == "rollout_shards_loader.slime.setup_hook"
    assert env["env_vars"]["ROLLOUT_SHARDS_ROOT"] == str(tmp_path)


def test_train_on_a_refused_step_fails_at_once_quoting_the_rule(slime: Any, tmp_path: Path) -> None:
    """The build refused step 2: slime's `train(2)` fails within a second with the rule,
    not after the wait."""
    import time

    from rollout_shards_loader import StepRefusedError

    from tests.support.loader import refuse_step

    _rows, settings = CASES["dp1"]
    refuse_step(tmp_path, tmp_path / "out", step=2)
    hook.install(tmp_path / "out")
    actor, seen = _trainer(slime, settings)
    _set_rank(slime, 0, 1)
    started = time.monotonic()
    with pytest.raises(StepRefusedError, match="rule reward_finite"):
        actor.train(2, None)
    assert time.monotonic() - started < 1
    assert seen == []
