"""rollout_shards_loader.miles against the miles release on PyPI (miles-rl 0.0.2, before
miles #591): its own trainer modules on CPU (tests/support/miles.py), in a module of
its own so that miles HEAD's modules are not loaded beside it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rollout_shards_loader import miles as hook
from rollout_shards_loader import read_rank

from pipeline.settings import load_settings
from tests.support import miles as ms
from tests.support.samples import build, sample, write_step


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    hook.uninstall()


def test_release_before_591_gets_the_dict(tmp_path_factory: pytest.TempPathFactory) -> None:
    """miles-rl 0.0.2 (PyPI): `process_rollout_data(args, ref, dp_rank, dp_size)` returns
    the rank dict, and its `train()` unpacks nothing. With the hook its `train()` holds
    read_rank's dict, tokens and loss masks as its `get_rollout_data` makes them, and its
    `get_data_iterator` schedules it."""
    import torch

    cache = tmp_path_factory.mktemp("release")
    source = ms.release_source(cache)
    write_step(cache / "in", [sample(i, reward=float(i % 2)) for i in range(8)])
    build(cache / "in", cache / "out", global_batch_size=4, dp_size=2)
    settings = load_settings(global_batch_size=4, dp_size=2).to_dict()
    with ms.miles_modules(source) as old:
        assert not hasattr(old.data, hook.PAIR_MARKER)
        args = ms.miles_args(settings)
        actor, seen = ms.trainer(old, args)
        hook.install(cache / "out")
        for rank in range(2):
            ms.set_rank(old, rank, settings)
            actor.train(1, None)
            want = read_rank(cache / "out" / "step=1", rank, dp_size=2)
            got = seen[rank]
            assert list(got) == list(want)
            for key in want:
                value = got[key]
                if key in ("tokens", "loss_masks"):
                    assert all(isinstance(t, torch.Tensor) for t in value)
                    value = [t.tolist() for t in value]
                assert ms.comparable(value) == ms.comparable(want[key]), key
            _, num_microbatches = old.data.get_data_iterator(args, None, got)
            assert num_microbatches == [2, 2]  # two optimizer steps of 2 rows per rank
        hook.uninstall()
