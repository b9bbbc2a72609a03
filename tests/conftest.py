"""Fixtures every test folder sees. Plain helpers live in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipeline.report.serve import URL_ENV

if TYPE_CHECKING:
    import dagster as dg

# The files whose tests take tens of seconds each (pip installs, a browser, Dagster's
# daemon, Ray clusters, the corpus, drawn trainer cases), slowest first. `make test` runs
# files in collection order (`--dist loadfile --no-loadscope-reorder`): these start first,
# so the last file a worker takes is a short one and both workers finish together. A file
# missing from the list runs after them, as collected.
SLOW_FIRST = (
    "tests/orchestration/test_team_deploy.py",
    "tests/e2e/test_installs.py",
    "tests/e2e/test_ui.py",
    "tests/trainers/verl/test_verl_v1.py",
    "tests/core/test_bad_inputs.py",
    "tests/trainers/miles/test_flops_shapes.py",
    "tests/orchestration/test_backfill.py",
    "tests/orchestration/test_compute_ray.py",
    "tests/core/test_dataset.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    # a stable sort: within a file, and among the other files, the collected order stays
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _no_report_url_from_the_shell() -> Iterator[None]:
    """A developer's shell may export `make ui`'s ROLLOUT_SHARDS_REPORT_URL; the tests that
    link reports under a URL set it themselves, the others expect the file: link."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(URL_ENV, raising=False)
        yield


@pytest.fixture
def rows_dir(tmp_path: Path) -> Path:
    return tmp_path / "rollouts"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance (temporary home, in-process runs)."""
    # Imported here: Dagster is seconds of imports that only the Dagster tests need.
    import dagster as dg

    with dg.instance_for_test() as instance:
        yield instance
