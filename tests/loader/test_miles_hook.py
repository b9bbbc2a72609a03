"""rollout_shards_loader.miles.install against a stand-in of miles' trainer interface: a
fake module tree with miles' names and call signatures (no miles code), asserting the
trainer-side data is exactly read_rank's dict for the step and the rank."""

from __future__ import annotations

import sys
import types
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import miles as hook
from rollout_shards_loader import read_rank

from tests.conftest import build, sample, write_step
from tests.loader.loader_support import assert_same_dict

NAMES = (
    "miles",
    "miles.utils",
    "miles.utils.data",
    "miles.backends",
    "miles.backends.training_utils",
    "miles.backends.training_utils.data",
    "miles.backends.megatron_utils",
    "miles.backends.megatron_utils.actor",
)


@pytest.fixture
def fake_miles(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """miles' shape: utils.data.process_rollout_data(args, ref, dp_rank, dp_size), imported by
    name into backends.training_utils.data, whose get_rollout_data(args, ref) calls it with
    the rank; MegatronTrainRayActor.train(self, rollout_id, rollout_data_ref, ...) calls
    get_rollout_data (imported by name into the actor module)."""
    modules = {name: types.ModuleType(name) for name in NAMES}
    calls: list[tuple[Any, ...]] = []

    def process_rollout_data(args, rollout_data_ref, dp_rank, dp_size):
        calls.append((rollout_data_ref, dp_rank, dp_size))
        return {"from": "ray", "rank": dp_rank}

    modules["miles.utils.data"].process_rollout_data = process_rollout_data
    training_data = modules["miles.backends.training_utils.data"]
    training_data.process_rollout_data = process_rollout_data
    state = types.SimpleNamespace(dp_rank=0, dp_size=2)

    def get_rollout_data(args, rollout_data_ref):
        # looks the name up in its module at call time, as miles' code does
        return training_data.process_rollout_data(
            args, rollout_data_ref, state.dp_rank, state.dp_size
        )

    training_data.get_rollout_data = get_rollout_data
    actor_module = modules["miles.backends.megatron_utils.actor"]
    actor_module.get_rollout_data = get_rollout_data

    class MegatronTrainRayActor:
        def __init__(self, args: Namespace) -> None:
            self.args = args
            self.seen: list[dict[str, Any]] = []

        def train(
            self, rollout_id, rollout_data_ref, witness_info=None, attempt=0, external_data=None
        ):
            self._last_rollout_id = rollout_id
            self.seen.append(actor_module.get_rollout_data(self.args, rollout_data_ref))

    actor_module.MegatronTrainRayActor = MegatronTrainRayActor
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(state=state, actor=MegatronTrainRayActor, calls=calls)


def test_trainer_reads_the_step_and_rank_from_the_shards(fake_miles, tmp_path: Path) -> None:
    rows = [sample(i, reward=float(i) * 0.5) for i in range(8)]
    write_step(tmp_path / "in", rows)
    root = tmp_path / "out"
    build(tmp_path / "in", root, global_batch_size=4, dp_size=2)
    (root / "step=7").symlink_to(root / "step=1")  # a second step id, same content
    hook.install(root)
    hook.install(root)  # twice: still one layer of patching
    actor = fake_miles.actor(Namespace(global_batch_size=4))
    for rollout_id in (1, 7):
        for rank in (0, 1):
            fake_miles.state.dp_rank = rank
            actor.train(rollout_id, ["ref0", "ref1"], attempt=0)
            want = read_rank(root / f"step={rollout_id}", rank, dp_size=2, global_batch_size=4)
            assert_same_dict(actor.seen[-1], want)
    assert fake_miles.calls == []  # ray was never asked
    # outside train, the original runs
    data = sys.modules["miles.backends.training_utils.data"]
    assert data.get_rollout_data(Namespace(), "ref") == {"from": "ray", "rank": 1}


def test_mismatched_global_batch_size_is_an_error(fake_miles, tmp_path: Path) -> None:
    write_step(tmp_path / "in", [sample(i) for i in range(8)])
    build(tmp_path / "in", tmp_path / "out", global_batch_size=4, dp_size=2)
    hook.install(tmp_path / "out")
    actor = fake_miles.actor(Namespace(global_batch_size=8))
    with pytest.raises(ValueError, match="global_batch_size=8"):
        actor.train(1, ["ref0", "ref1"])
