"""`pip install .` without extras: the CLI and the core, no Dagster, the same shards.

A fresh virtualenv gets the project without extras (what a user puts in CI for
`rollout-shards validate`), must hold no Dagster package, and must build the embedded
data into shards byte-identical to the ones the Dagster path (`make run`) writes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import venv
from pathlib import Path

import pytest

from pipeline.orchestration import run_all
from tests.support.dagster_roots import Roots, configured_roots

REPO = Path(__file__).resolve().parents[2]


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.glob("step=*/*.parquet"))
    }


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("light") / "venv"
    venv.create(folder, with_pip=True)
    python = folder / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    return folder


def test_the_light_install_has_no_dagster(light_venv: Path) -> None:
    listed = subprocess.run(
        [light_venv / "bin" / "python", "-m", "pip", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    names = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert "rollout-shards" in names
    assert not {name for name in names if name.startswith("dagster")}
    # no figure library either: the `report` extra brings it
    assert "leather" not in names


def test_the_light_cli_builds_what_the_dagster_path_builds(
    light_venv: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    roots: Roots = configured_roots(tmp_path, monkeypatch)
    assert run_all.main() == 0
    capsys.readouterr()

    light_out = tmp_path / "light_shards"
    built = subprocess.run(
        [light_venv / "bin" / "rollout-shards", "build", str(roots.input), "--out", str(light_out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    # no report without the figure library: said once, and recorded in each manifest
    notes = [line for line in built.stderr.splitlines() if "no report.html written" in line]
    assert len(notes) == 1, built.stderr
    for manifest in sorted(light_out.glob("step=*/manifest.json")):
        assert json.loads(manifest.read_text())["report"] is None
    assert sorted(roots.output.glob("step=*/report.html"))  # the Dagster side draws them
    dagster_digests = _digests(roots.output)
    assert len(dagster_digests) >= 4
    assert _digests(light_out) == dagster_digests


def test_the_cli_installs_beside_miles_pins_and_validates_there(tmp_path: Path) -> None:
    """Where trainers live (miles pins polars==1.42.1): `pip install .` keeps the pinned
    Polars, and `rollout-shards validate` runs there, on a root and on one step file."""
    from tests.support.loader import MILES_PINS

    folder = tmp_path / "venv"
    venv.create(folder, with_pip=True)
    python = folder / "bin" / "python"
    pip = [python, "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *MILES_PINS], check=True, capture_output=True, text=True)
    subprocess.run([*pip, str(REPO)], check=True, capture_output=True, text=True)
    version = subprocess.run(
        [python, "-c", "import polars; print(polars.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == "1.42.1"
    cli = folder / "bin" / "rollout-shards"
    data = REPO / "data" / "rollouts"
    for target in (data, data / "step=1.parquet"):
        run = subprocess.run([cli, "validate", str(target)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert "valid, " in run.stdout
