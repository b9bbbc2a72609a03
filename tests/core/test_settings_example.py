"""docs/settings.example.yaml, the example settings file the README points to: every
setting, in the contract's order, at its default (the global batch size miles needs
besides), read by the project's own settings-file reader and taken by `validate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.settings import make_settings, read_config, setting_defaults, setting_fields
from tests.conftest import REPO, sample, write_step

EXAMPLE = REPO / "docs" / "settings.example.yaml"


def test_the_example_lists_every_setting_at_its_default() -> None:
    text = EXAMPLE.read_text()
    written = list(yaml.safe_load(text))
    assert written == [name for name, _, _ in setting_fields()]
    values = read_config(EXAMPLE)
    assert values == {**setting_defaults(), "global_batch_size": 8}
    make_settings(values)  # build takes them
    for name, _, description in setting_fields():
        # each setting under its description (wrapped over comment lines)
        above = text.split(f"\n{name}: ")[0].rsplit("\n\n", 1)[-1]
        assert " ".join(line.removeprefix("# ") for line in above.splitlines()).startswith(
            description
        ), name


def test_validate_takes_the_example(tmp_path: Path) -> None:
    write_step(tmp_path / "rollouts", [sample(i, group_index=i // 4) for i in range(8)])
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "validate", str(tmp_path / "rollouts"),
         "--config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step 1: valid, 8 rows, 8 would be written" in done.stdout
