"""An install before miles is imported (what Ray's setup hook does) patches miles HEAD's
own modules the moment their import finishes. A module of its own: no other test's miles
modules are loaded when it imports them."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollout_shards_loader import miles as hook

from tests.support import miles as ms
from tests.support.samples import build, sample, write_step


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    hook.uninstall()


def test_install_before_import_patches_on_import(tmp_path: Path) -> None:
    """The setup hook runs before miles is imported: the patch lands when Ray's import
    of the actor module finishes, before anything sees the class."""
    source = ms.head_source(tmp_path)
    write_step(tmp_path / "in", [sample(i) for i in range(4)])
    build(tmp_path / "in", tmp_path / "out", global_batch_size=2, dp_size=2)
    assert not any(name == "miles" or name.startswith("miles.") for name in sys.modules)
    hook.install(tmp_path / "out")
    with ms.miles_modules(source) as fresh:
        train = fresh.actor.MegatronTrainRayActor.train
        assert getattr(train, hook.ORIGINAL).__qualname__.endswith("train")
        assert getattr(fresh.data.process_rollout_data, hook.ORIGINAL) is (
            fresh.utils_data.process_rollout_data
        )
        # the module is still the file it was: its source and code come from its loader
        assert "def get_rollout_data" in inspect.getsource(fresh.data)
        assert fresh.data.__spec__.loader.get_source(fresh.data.__name__) is not None
