"""The loader installs where trainers live: a clean venv holding miles' pins
(polars==1.42.1, numpy, pyarrow) gains the loader and changes no other package; there it
reads a built step exactly as the reference's rank dicts say, floats by bits."""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from tests.support.loader import MILES_PINS, bits, expected_rank_dicts
from tests.support.samples import REPO, build, sample, write_step

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


def _pip(python: Path, *args: str) -> str:
    run = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return run.stdout


def _freeze(python: Path) -> set[str]:
    # name==version for every package, local installs too (pip freeze writes their URL)
    return set(_pip(python, "list", "--format=freeze").split())


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


def test_loader_installs_beside_miles_pins_and_reads_a_step(tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    _pip(python, "install", "-q", *MILES_PINS)
    before = _freeze(python)
    source = tmp_path / "loader"  # a copy: the build leaves nothing in the checkout
    shutil.copytree(REPO / "loader", source)
    _pip(python, "install", "-q", str(source))
    after = _freeze(python)
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
