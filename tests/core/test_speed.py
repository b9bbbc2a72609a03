"""Every speed trick is behind one switch (`pipeline.speed`), and none changes a byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import speed
from tests.support.samples import REPO, generated_step


def _build(inputs: Path, out: Path, off: str | None) -> dict[str, bytes]:
    """A whole `rollout-shards build` process (the head start and process settings are the
    program's), with `off` switched off; every written file by name."""
    env = {"PATH": "/usr/bin:/bin"} | ({speed.OFF_ENV: off} if off is not None else {})
    command = [sys.executable, "-m", "pipeline.cli", "build", str(inputs), "--out", str(out)]
    flags = ["--global-batch-size", "64", "--dp-size", "4", "--stream-above", "1"]
    subprocess.run([*command, *flags], cwd=REPO, env=env, check=True, capture_output=True)
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file() and ".locks" not in path.parts
    }


def test_each_switch_turned_off_gives_the_same_bytes(tmp_path: Path) -> None:
    inputs = generated_step(tmp_path / "in", samples=6000)
    assert (inputs / "step=0.parquet").stat().st_size > 1 << 20  # read in parts too
    small = generated_step(tmp_path / "small", samples=600)
    for folder in (inputs, small):
        expected = _build(folder, tmp_path / "on" / folder.name, None)
        assert "step=0/rank=3.parquet" in expected
        for off in (*speed.SWITCHES, "all"):
            assert _build(folder, tmp_path / off / folder.name, off) == expected, off


@pytest.mark.parametrize("value", ["", "head_start", " all", "process, arrow_pool"])
def test_the_switches_read_the_environment(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(speed.OFF_ENV, value)
    off = {name.strip() for name in value.split(",")}
    for switch in speed.SWITCHES:
        assert speed.on(switch) is not (switch in off or "all" in off)
    assert speed.read_threads() == (1 if "all" in off else max(2, os.cpu_count() or 1))


def _anonymous_mib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) >> 10
    raise AssertionError("no RssAnon in /proc/self/status")


def test_the_read_gives_the_pages_arrow_freed_back_when_it_ends() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    one = pa.array(np.ones(1 << 17, dtype=np.int64))  # 1 MiB
    with speed.returning_arrow_pool():
        parts = [pc.add(one, i) for i in range(96)]  # decoded parts, from Arrow's pool
        assert pa.default_memory_pool().bytes_allocated() >= 96 << 20
        del parts
        held = _anonymous_mib()  # freed, and kept by the pool for its next allocations
    assert held - _anonymous_mib() >= 64
