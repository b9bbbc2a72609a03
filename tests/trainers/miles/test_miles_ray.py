"""The install point under real Ray: the job's runtime env from `runtime_env(root)` runs
the setup hook in the actor's worker before Ray loads the actor class, also when the
actor has a runtime env of its own (miles gives its training actors `env_vars`), so the
method Ray calls is the wrapped one; an install inside the actor, after Ray took the
methods, raises at the first `train()`.

The actor here is a stand-in with miles' module path, class name and call shape
(written by the test, no miles code): what is under test is Ray's loading, which miles'
own code does not take part in (tests/trainers/miles/test_miles_head.py runs miles' code)."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from rollout_shards_loader import read_rank
from rollout_shards_loader.miles import runtime_env

from tests.support.samples import REPO, build, sample, write_step

STAND_IN = {
    "miles/__init__.py": "",
    "miles/backends/__init__.py": "",
    "miles/backends/training_utils/__init__.py": "",
    "miles/backends/training_utils/data.py": """
        def process_rollout_data(args, rollout_data_ref, dp_rank, dp_size):
            return {"from": "the rollout side"}

        def get_rollout_data(args, rollout_data_ref, rank):
            return process_rollout_data(args, rollout_data_ref, rank, 2)
    """,
    "miles/backends/megatron_utils/__init__.py": "",
    "miles/backends/megatron_utils/actor.py": """
        from argparse import Namespace
        from miles.backends.training_utils.data import get_rollout_data

        class MegatronTrainRayActor:
            def __init__(self, late_root=None):
                if late_root is not None:  # an install after Ray took the methods
                    from rollout_shards_loader.miles import install
                    install(late_root)

            def train(self, rollout_id, rollout_data_ref, rank=0):
                return get_rollout_data(Namespace(global_batch_size=2), rollout_data_ref, rank)
    """,
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("ray-hook")
    for name, text in STAND_IN.items():
        (work / "code" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "code" / name).write_text(textwrap.dedent(text))
    rows = [sample(i, reward=float(i)) for i in range(4)]
    write_step(work / "in", rows)
    build(work / "in", work / "out", global_batch_size=2, dp_size=2)
    sys.path.insert(0, str(work / "code"))
    try:
        yield work
    finally:
        sys.path.remove(str(work / "code"))
        for name in [m for m in sys.modules if m == "miles" or m.startswith("miles.")]:
            del sys.modules[name]


@contextlib.contextmanager
def _job(env: dict[str, Any]) -> Iterator[None]:
    """A Ray job of its own (a local cluster, on 127.0.0.1 only) with the runtime env `env`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            num_cpus=2,
            include_dashboard=False,
            runtime_env=env,
            logging_level="ERROR",
        )
        try:
            yield
        finally:
            ray.shutdown()


def _training_actor() -> Any:
    from miles.backends.megatron_utils.actor import MegatronTrainRayActor

    # as miles' actor_factory: ray.remote(cls, runtime_env={"env_vars": ...})
    return ray.remote(num_cpus=0, runtime_env={"env_vars": {"OWN": "1"}})(MegatronTrainRayActor)


def _path(work: Path) -> str:
    return os.pathsep.join([str(work / "code"), str(REPO / "loader")])


def test_setup_hook_wraps_train_before_ray_loads_the_class(work: Path) -> None:
    with _job(runtime_env(work / "out", {"env_vars": {"PYTHONPATH": _path(work)}})):
        actor = _training_actor().remote()
        for rank in (0, 1):
            got = ray.get(actor.train.remote(1, None, rank))
            assert got == read_rank(work / "out" / "step=1", rank, dp_size=2)


def test_install_after_ray_took_the_methods_raises(work: Path) -> None:
    # no setup hook: the actor installs in its own __init__, after Ray loaded the class
    with _job({"env_vars": {"PYTHONPATH": _path(work)}}):
        actor = _training_actor().remote(str(work / "out"))
        with pytest.raises(ray.exceptions.RayTaskError, match="LateInstallError"):
            ray.get(actor.train.remote(1, None, 0))
