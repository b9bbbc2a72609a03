"""Fixtures every test folder sees. Plain helpers live in tests/support/."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipeline.report.serve import URL_ENV

if TYPE_CHECKING:
    import dagster as dg

# The files that start services (Dagster's daemon and webserver, Ray clusters, a browser,
# pip installs, an S3 server) or build many steps, longest first. `make test` runs files in
# collection order (`--dist loadfile --no-loadscope-reorder`): these start first, while
# their waits on the services leave the cores to the other workers, and the many short files
# of tests/core come last, so the workers finish together with no one waiting on a service.
# A file missing from the list runs after them, as collected.
SLOW_FIRST = (
    "tests/orchestration/test_team_deploy.py",
    "tests/e2e/test_installs.py",
    "tests/e2e/test_ui.py",
    "tests/trainers/verl/test_verl_v1.py",
    "tests/orchestration/test_compute_ray.py",
    "tests/orchestration/test_ray_jobs.py",  # the Ray head's other users beside it
    "tests/core/test_bad_inputs.py",
    "tests/orchestration/test_ray_ranks.py",
    "tests/storage/test_ray_store.py",
    "tests/orchestration/test_assets.py",
    "tests/orchestration/test_backfill.py",
    "tests/storage/test_object_storage.py",
    "tests/core/test_dataset.py",
    "tests/orchestration/test_run_all.py",
    "tests/orchestration/test_compute_subprocess.py",
    "tests/trainers/miles/test_miles_ray.py",
    "tests/core/test_bounded.py",
    "tests/core/test_readers_agree.py",
    "tests/core/test_crash.py",
    "tests/core/test_interrupts.py",
    "tests/storage/test_dagster_store.py",
    "tests/trainers/miles/test_flops_shapes.py",
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


@pytest.fixture(scope="session", autouse=True)
def _sigint_handled() -> None:
    """A worker that a script started in the background (`make test &` under sh) has SIGINT
    ignored, and a Dagster run in process points SIGTERM at SIGINT's handler: the servers a
    test starts after such a run would ignore the SIGTERM that stops them. The worker takes
    Python's handler, as in a terminal (`make run` puts SIGTERM back itself: run_all)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def rows_dir(tmp_path: Path) -> Path:
    return tmp_path / "rollouts"


@pytest.fixture(scope="session")
def _dagster_home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A test instance's home with its storages created (SQLite schemas and migrations, a
    good part of a second of CPU), once per worker: each `instance` starts from a copy."""
    import dagster as dg

    home = tmp_path_factory.mktemp("dagster-home-template")
    with dg.instance_for_test(temp_dir=str(home)):
        pass
    return home


@pytest.fixture
def instance(_dagster_home_template: Path, tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance (temporary home, in-process runs)."""
    # Imported here: Dagster is seconds of imports that only the Dagster tests need.
    import dagster as dg

    home = tmp_path / "dagster-home"
    shutil.copytree(_dagster_home_template, home)
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield instance
