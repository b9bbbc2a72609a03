"""slime's own rollout dumps as input (`save_debug_rollout_data`: `torch.save({"rollout_id",
"samples": [Sample.to_dict()]})`, written here by slime's own function): read without torch
and without running code (`pipeline.io.formats.miles`, the same restricted reader as miles'
dumps), built with `--trainer slime`, each rank read back equals what slime's trainer holds
when its rollout manager loads the same dump (`--load-debug-rollout-data`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from rollout_shards_loader import slime as slime_loader

from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step.build import build_step
from tests.support import slime as ss
from tests.support.slime_cases import CASES


@pytest.mark.parametrize(
    "name",
    [
        "log_probs",
        "extras_round_raw_source",
        "multi_leaf_fill",
        "reward_key",
        "dp4_trailing_dropped",
    ],
)
def test_slime_dump_builds_slimes_dict(slime: Any, tmp_path: Path, name: str) -> None:
    rows, settings = CASES[name]
    dump = tmp_path / "dump" / "rollout_data" / "3.pt"
    ss.save_dump(slime, copy.deepcopy(rows), dump, step=3)
    ((step, sources),) = group_steps(find_sources([tmp_path / "dump"])).items()
    assert step == 3
    build_step(step, sources, load_settings(trainer="slime", **settings), tmp_path / "out")
    theirs = ss.rank_dicts_from_dump(slime, settings, str(dump.parent / "{rollout_id}.pt"), 3)
    folder = tmp_path / "out" / "step=3"
    ours = [slime_loader.read_rank(folder, rank) for rank in range(len(theirs))]
    assert [ss.canonical(d) for d in ours] == [ss.canonical(d) for d in theirs]


def test_slime_dump_reads_without_torch(slime: Any, tmp_path: Path) -> None:
    """The read imports no torch (blocked in a fresh interpreter) and builds nothing the
    file names: tensors and numpy arrays come from the archive's bytes."""
    import subprocess
    import sys

    rows, _settings = CASES["log_probs"]
    dump = tmp_path / "rollout_data" / "1.pt"
    ss.save_dump(slime, copy.deepcopy(rows), dump, step=1)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pipeline.io.formats.miles import read_miles_dump\n"
        f"frame = read_miles_dump({str(dump)!r})\n"
        "print(frame.height, sorted(frame.columns))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ss.REPO
    )
    assert done.returncode == 0, done.stderr
    height, _, names = done.stdout.partition(" ")
    assert int(height) == len(rows)
    assert "rollout_log_probs" in names and "teacher_log_probs" in names
