"""What a user installs, in clean virtualenvs:

- `pip install .` without extras (what a user puts in CI for `rollout-shards validate`):
  the CLI and the core, no Dagster and no figure library, building the embedded data into
  shards and reports byte-identical to the ones the Dagster path (`make run`) writes;
- where trainers live, a venv holding miles' pins (polars==1.42.1, numpy, pyarrow): the
  loader installs and changes no other package, and reads a built step exactly as the
  reference's rank dicts say, floats by bits; then the CLI installs beside it, keeps the
  pinned Polars and validates there;
- both distributions carry the Apache-2.0 license in their metadata.

One wheel of the project serves both venvs (`pip install .` builds the same one).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.orchestration import run_all
from tests.support.dagster_roots import Roots, configured_roots
from tests.support.loader import MILES_PINS, bits, expected_rank_dicts
from tests.support.samples import REPO, build, sample, write_step
from tests.support.venvs import bare_venv, installed, pip, wheel

# The venv has the loader but not the tests: the comparison function goes in as source.
READ_IN_VENV = f"""
from __future__ import annotations
import json, sys
from typing import Any
from rollout_shards_loader import read_rank
{inspect.getsource(bits)}
folder, dp = sys.argv[1], int(sys.argv[2])
got = [read_rank(folder, r, dp_size=dp) for r in range(dp)]
print(json.dumps([[list(d), bits(d)] for d in got]))
"""


def _isolated(python: Path, script: str, folder: Path) -> str:
    """What `script` prints, run by the venv's python on a step folder, without this
    checkout on its path (it runs in the step's parent folder)."""
    run = subprocess.run(
        [str(python), "-I", "-c", script, str(folder)],
        capture_output=True,
        text=True,
        cwd=folder.parent,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def _digests(root: Path, pattern: str = "step=*/*.parquet") -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.glob(pattern))
    }


# Figure libraries none of the installs needs: the reports draw their own SVG.
FIGURE_LIBRARIES = {"leather", "matplotlib", "plotly", "altair", "bokeh", "pygal", "seaborn"}


@pytest.fixture(scope="module")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel(REPO, tmp_path_factory.mktemp("project_wheel"))


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory, project_wheel: Path) -> Path:
    folder = tmp_path_factory.mktemp("light") / "venv"
    pip(bare_venv(folder), "install", "--quiet", str(project_wheel))
    return folder


@dataclass(frozen=True)
class MilesVenv:
    python: Path
    pins: set[str]  # what `pip list` held with miles' pins alone
    with_loader: set[str]  # and after the loader
    with_cli: set[str]  # and after the project (the CLI)


@pytest.fixture(scope="module")
def miles_venv(tmp_path_factory: pytest.TempPathFactory, project_wheel: Path) -> MilesVenv:
    """miles' pins, then the loader, then the project, in one venv."""
    work = tmp_path_factory.mktemp("miles")
    python = bare_venv(work / "venv")
    pip(python, "install", "--quiet", *MILES_PINS)
    pins = installed(python)
    source = work / "loader"  # a copy: the build leaves nothing in the checkout
    shutil.copytree(REPO / "loader", source)
    pip(python, "install", "--quiet", str(source))
    with_loader = installed(python)
    pip(python, "install", "--quiet", str(project_wheel))
    return MilesVenv(python, pins, with_loader, installed(python))


def test_the_light_install_has_no_dagster(light_venv: Path) -> None:
    listed = pip(light_venv / "bin" / "python", "list", "--format", "json")
    names = {package["name"].lower() for package in json.loads(listed)}
    assert "rollout-shards" in names
    assert not {name for name in names if name.startswith("dagster")}
    # no figure library either, though its builds write their reports
    assert not names & FIGURE_LIBRARIES


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
    # every step's report, drawn without a figure library, named by its manifest
    manifests = sorted(light_out.glob("step=*/manifest.json"))
    assert len(manifests) >= 4
    for manifest in manifests:
        assert json.loads(manifest.read_text())["report"] == "report.html"
    dagster_digests = _digests(roots.output)
    assert len(dagster_digests) >= 4
    assert _digests(light_out) == dagster_digests
    reports = _digests(roots.output, "step=*/report.html")
    assert len(reports) == len(manifests)
    assert _digests(light_out, "step=*/report.html") == reports


def test_loader_installs_beside_miles_pins_and_reads_a_step(
    miles_venv: MilesVenv, tmp_path: Path
) -> None:
    python, before, after = miles_venv.python, miles_venv.pins, miles_venv.with_loader
    assert after - before == {"rollout-shards-loader==0.1.0"}
    assert before - after == set()
    assert "polars==1.42.1" in after

    rows = [
        sample(
            i,
            reward=0.7 * (i % 3),
            group_index=i // 4,
            response_length=1 + i % 4,
            rollout_log_probs=[-0.3 * (k + 1) for k in range(1 + i % 4)],
            weight_versions=["v3"] if i % 3 == 0 else None,
        )
        for i in range(12)
    ]
    write_step(tmp_path / "in", rows)
    chosen = {"global_batch_size": 4, "dp_size": 2}
    build(tmp_path / "in", tmp_path / "out", **chosen)
    folder = tmp_path / "out" / "step=1"
    want = expected_rank_dicts(rows, chosen, folder)

    # the venv's python without this checkout on its path: only the installed loader
    run = subprocess.run(
        [str(python), "-I", "-c", READ_IN_VENV, str(folder), "2"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    got = json.loads(run.stdout)
    expected = json.loads(json.dumps([[list(d), bits(d)] for d in want]))
    assert len(got) == len(expected) == 2
    for (got_keys, got_bits), (want_keys, want_bits) in zip(got, expected, strict=True):
        assert got_keys == want_keys
        for key in want_keys:
            assert got_bits[key] == want_bits[key], key
    assert sys.executable != str(python)

    # the verl module imports without verl (or torch); its reader says what it needs
    said = _isolated(python, VERL_WITHOUT_VERL, folder)
    assert said.strip() == "runs in verl's environment (tensordict is not installed)"

    # the slime module imports without torch; its reader says in one line where it runs
    assert _isolated(python, SLIME_WITHOUT_TORCH, folder) == (
        "rollout_shards_loader.slime.read_rank runs in slime's environment (torch is not "
        "installed): install the loader where slime runs\n"
    )


def test_the_cli_installs_beside_miles_pins_and_validates_there(miles_venv: MilesVenv) -> None:
    """Where trainers live (miles pins polars==1.42.1): `pip install .` keeps the pinned
    Polars, and `rollout-shards validate` runs there, on a root and on one step file."""
    assert "polars==1.42.1" in miles_venv.with_cli
    assert miles_venv.with_loader <= miles_venv.with_cli
    version = subprocess.run(
        [miles_venv.python, "-c", "import polars; print(polars.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert version.stdout.strip() == "1.42.1"
    cli = miles_venv.python.parent / "rollout-shards"
    data = REPO / "data" / "rollouts"
    for target in (data, data / "step=1.parquet"):
        run = subprocess.run([cli, "validate", str(target)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert "valid, " in run.stdout


VERL_WITHOUT_VERL = """
import sys
import rollout_shards_loader.verl as verl_side
assert not {"verl", "torch", "tensordict"} & set(sys.modules)
try:
    verl_side.read_rank(sys.argv[1], 0)
except ImportError as error:
    print(str(error).partition("read_rank ")[2].partition(":")[0])
"""


SLIME_WITHOUT_TORCH = """
import sys
import rollout_shards_loader.slime as slime_side
assert "torch" not in sys.modules
try:
    slime_side.read_rank(sys.argv[1], 0)
except ImportError as error:
    print(error)
"""


# setuptools' metadata hook, run in a copy: a deprecated or unread license field warns
METADATA = """
import sys, warnings
warnings.simplefilter("error")
from setuptools import build_meta
print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


def _metadata(source: Path, into: Path) -> dict[str, list[str]]:
    into.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", METADATA, str(into)],
        cwd=source,
        check=True,
        capture_output=True,
        text=True,
    )
    text = (into / run.stdout.split()[-1] / "METADATA").read_text()
    fields: dict[str, list[str]] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    return fields


def test_both_distributions_carry_the_apache_license(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "pipeline", project / "pipeline")
    loader = tmp_path / "loader"
    shutil.copytree(REPO / "loader", loader)
    apache = "Apache License\n                           Version 2.0, January 2004"
    for source, name in ((project, "rollout-shards"), (loader, "rollout-shards-loader")):
        fields = _metadata(source, tmp_path / f"{name}-meta")
        assert fields["Name"] == [name]
        assert fields["License-Expression"] == ["Apache-2.0"]
        assert fields["License-File"] == ["LICENSE"]
        assert "Metadata-Version" in fields
        assert apache in (source / "LICENSE").read_text()
