"""Bad input of the newest surfaces (Ray addresses, model shapes, int64 settings, mixed-trainer
roots, truncated inputs), each as a user meets it: the CLI as a
process, one stderr line, the exit status (1 bad data, 2 usage), under 15 s, nothing of
the refused step published and the other steps built."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.dataset as ds
import pytest

from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step.build import build_step
from pipeline.trainers.miles.flags import parse_layer_pattern
from pipeline.trainers.miles.settings import MODEL_SHAPE
from pipeline.transforms.flops import forward_flops, miles_model_shape
from tests.support.samples import REPO, generated_step, sample, write_step

PROG = "rollout-shards"
INT64_MAX = (1 << 63) - 1
BEYOND = 1 << 63
ROWS = [sample(i, group_index=i, weight_versions=["1"]) for i in range(4)]


def cli(*args: str | Path, prelude: str = "") -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI as a process (after `prelude`, Python run first), and its seconds."""
    code = f"{prelude}\nimport sys\nfrom pipeline.cli import main\nsys.exit(main(sys.argv[1:]))"
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=60,
    )
    return result, time.monotonic() - began


def built(out: Path) -> list[str]:
    """The committed step folders under `out`."""
    return sorted(p.name for p in out.glob("step=*") if (p / "manifest.json").is_file())


def lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if ": warning: " not in line]


@pytest.mark.parametrize("port", ["+6379", "-1", "６３７９", "0", "65536"])
def test_a_ray_port_that_is_not_digits_is_a_usage_error_at_once(tmp_path: Path, port: str) -> None:
    write_step(tmp_path / "in", ROWS)
    out = tmp_path / "out"
    flags = ["--global-batch-size", "2", "--ray", f"127.0.0.1:{port}", "--ray-above", "0"]
    result, seconds = cli("build", tmp_path / "in", "--out", out, *flags)
    assert (result.returncode, seconds < 15, built(out)) == (2, True, [])
    assert lines(result) == [
        f"{PROG}: usage error: invalid settings: ray_address: '127.0.0.1:{port}' is not a Ray "
        "cluster's address: give its GCS as host:port (the port 1 to 65535, digits only), "
        "ray://host:port or auto"
    ]


def test_a_ray_port_that_accepts_and_never_answers_is_refused_in_seconds(tmp_path: Path) -> None:
    """Step 1 (small, kept in process) is built; step 2 (above --ray-above 1 MiB) goes to the
    cluster, whose port accepts and stays silent: one line within 15 s, step 2 unpublished."""
    write_step(tmp_path / "in", ROWS, step=1)
    big = pl.read_parquet(generated_step(tmp_path / "gen") / "step=0.parquet")
    big.with_columns(pl.lit(2, dtype=pl.Int64).alias("step")).write_parquet(
        tmp_path / "in" / "step=2.parquet", compression="uncompressed"
    )
    assert (tmp_path / "in" / "step=2.parquet").stat().st_size > 1 << 20
    out = tmp_path / "out"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        flags = ["--global-batch-size", "2", "--ray", address, "--ray-above", "1"]
        result, seconds = cli("build", tmp_path / "in", "--out", out, *flags)
    assert (result.returncode, seconds < 15, built(out)) == (2, True, ["step=1"])
    assert lines(result) == [
        f"{PROG}: usage error: the Ray cluster at {address} did not answer in 5 s (the port "
        "accepts connections but is no Ray GCS, or the head is stuck): give the GCS address "
        "of a running head (head:6379, what `ray start --address` takes)"
    ]


HIDE_RAY = """
import sys
class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoRay())
"""


def test_ray_without_the_extra_names_the_extra(tmp_path: Path) -> None:
    write_step(tmp_path / "in", ROWS)
    out = tmp_path / "out"
    flags = ["--global-batch-size", "2", "--ray", "127.0.0.1:6379", "--ray-above", "0"]
    result, seconds = cli("build", tmp_path / "in", "--out", out, *flags, prelude=HIDE_RAY)
    assert (result.returncode, seconds < 15, built(out)) == (2, True, [])
    assert lines(result) == [
        f"{PROG}: usage error: --ray (ray_address) needs Ray, which is not installed: "
        "pip install 'rollout-shards[ray]'"
    ]


SHAPE = [
    "--balance-by-flops", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64",
    "--cp-size", "1", "--num-layers", "2", "--hidden-size", "16", "--num-attention-heads",
    "2", "--vocab-size", "100", "--ffn-hidden-size", "32",
]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ["--hidden-size", str(10**30)],
            f"invalid settings: hidden_size: the integer {10**30} is beyond int64 "
            "(given in flag --hidden-size)",
        ),
        (
            ["--num-layers", str(BEYOND)],
            f"invalid settings: num_layers: the integer {BEYOND} is beyond int64 "
            "(given in flag --num-layers)",
        ),
        (
            ["--num-experts", "2", "--moe-layer-freq", "[1]*65536*65536"],
            "argument --moe-layer-freq: the layer pattern '[1]*65536*65536' lists more than "
            "65,536 layers (see rollout-shards --help)",
        ),
        (
            ["--num-experts", "2", "--moe-layer-freq", "[1]*40000+[" + "1," * 30000 + "]"],
            "argument --moe-layer-freq: the layer pattern '[1]*40000+[1,1,1,1,1,1,1,1,1,1,1,1,1"
            ",1,1,1,1,1,1,1,1,1,1,1,1' ... (60,012 characters) lists more than 65,536 layers "
            "(see rollout-shards --help)",
        ),
    ],
)
def test_model_shapes_beyond_bounds_are_usage_errors(
    tmp_path: Path, flags: list[str], line: str
) -> None:
    write_step(tmp_path / "in", ROWS)
    out = tmp_path / "out"
    result, seconds = cli("build", tmp_path / "in", "--out", out, "--global-batch-size", "2",
                          *SHAPE, *flags)  # fmt: skip
    assert (result.returncode, seconds < 15, built(out)) == (2, True, [])
    assert lines(result) == [f"{PROG}: usage error: {line}"]


def test_the_largest_model_shape_in_int64_has_finite_flops() -> None:
    """Every shape flag at int64's largest value, a million-token row: the exact integer
    terms rounded to float64 stay far below its range (about 2**270 of 2**1024)."""
    names = [name for name in MODEL_SHAPE if name != "moe_layer_freq"]
    settings = load_settings(
        global_batch_size=2, balance_by_flops=True, use_dynamic_batch_size=True,
        max_tokens_per_gpu=64, **dict.fromkeys(names, INT64_MAX), moe_layer_freq=1,
    )  # fmt: skip
    flops = forward_flops(np.array([1, 10**6]), miles_model_shape(settings))
    assert np.isfinite(flops).all() and flops[1] > flops[0] > 0
    assert parse_layer_pattern("[1]*65536") == [1] * 65536
    with pytest.raises(ValueError, match=r"\(140,002 characters\) lists more than 65,536"):
        parse_layer_pattern("[" + "1," * 70000 + "]")


def test_weight_versions_beyond_int64_are_refused(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    write_step(inputs, ROWS, step=1)
    beyond = [sample(i, group_index=i, weight_versions=[str(BEYOND), "w"]) for i in range(2)]
    write_step(inputs, [*beyond, *ROWS[2:]], step=2)
    for budget in ([], ["--max-weight-staleness", "1"]):
        out = tmp_path / f"out{len(budget)}"
        flags = ["--global-batch-size", "2", *budget]
        result, seconds = cli("build", inputs, "--out", out, *flags)
        assert (result.returncode, seconds < 15, built(out)) == (1, True, ["step=1"])
        assert lines(result)[-1] == (
            f"{PROG}: build: step 2: rule weight_version_beyond_int64: weight_versions holds a "
            "version of digits beyond int64 (9223372036854775807), which miles reads as a "
            "number: write the engine's weight version; rows (index, leaf): (0, 0), (1, 0)"
        )


VERL = ["--trainer", "verl", "--train-batch-size", "1", "--max-prompt-length", "64",
        "--max-response-length", "64", "--pad-token-id", "0"]  # fmt: skip


def test_verl_settings_beyond_int64_are_refused_from_flags_and_files(tmp_path: Path) -> None:
    write_step(tmp_path / "in", ROWS)
    config = tmp_path / "verl.yaml"
    config.write_text(f"rollout_n: {BEYOND}\n")
    out = tmp_path / "out"
    by_flag, flag_s = cli("build", tmp_path / "in", "--out", out, *VERL, "--rollout-n", BEYOND)
    by_file, file_s = cli("build", tmp_path / "in", "--out", out, *VERL, "--config", config)
    assert (by_flag.returncode, by_file.returncode, flag_s < 15, file_s < 15) == (2, 2, True, True)
    assert built(out) == []
    assert lines(by_flag) == [
        f"{PROG}: usage error: invalid settings: rollout_n: the integer {BEYOND} is beyond int64 "
        "(given in flag --rollout-n)"
    ]
    assert lines(by_file) == [
        f"{PROG}: usage error: config {config}, setting rollout_n: the integer '{BEYOND}' is "
        "beyond int64"
    ]


def test_a_root_of_another_trainer_is_refused_and_stays_one_dataset(tmp_path: Path) -> None:
    write_step(tmp_path / "in", ROWS, step=1)
    write_step(tmp_path / "in", ROWS, step=2)
    out = tmp_path / "out"
    first, _ = cli("build", tmp_path / "in", "--out", out, "--global-batch-size", "2")
    assert first.returncode == 0 and built(out) == ["step=1", "step=2"]
    before = {p: p.read_bytes() for p in sorted(out.rglob("*.parquet"))}
    slime = ["--trainer", "slime", "--global-batch-size", "2", "--rollout-batch-size", "2"]
    result, seconds = cli("build", tmp_path / "in", "--out", out, *slime)
    assert (result.returncode, seconds < 15) == (2, True)
    assert lines(result) == [
        f"{PROG}: usage error: {out} holds steps built for another trainer (the miles "
        "trainer's step=1, step=2), and a root read whole is one dataset whose rank files "
        "have one set of columns: build the slime trainer's shards into another --out (or "
        "remove those steps)"
    ]
    # every path (Dagster's too) meets the commit's check, here a step not yet in the root
    write_step(tmp_path / "more", ROWS, step=3)
    ((step, sources),) = group_steps(find_sources([tmp_path / "more"])).items()
    settings = load_settings(trainer="slime", global_batch_size=2, rollout_batch_size=2)
    with pytest.raises(StepError) as refused:
        build_step(step, sources, settings, out)
    assert [v.rule for v in refused.value.violations] == ["one_trainer_per_root"]
    assert {p: p.read_bytes() for p in sorted(out.rglob("*.parquet"))} == before
    assert built(out) == ["step=1", "step=2"]
    table = ds.dataset(out, format="parquet", exclude_invalid_files=True).to_table()
    assert table.num_rows == sum(json.loads((out / s / "manifest.json").read_text())["counts"]
                                 ["written"] for s in built(out))  # fmt: skip


def _truncate_when_touched(pid: int, path: Path, size: int) -> None:
    """Truncate `path` once process `pid` has it open or mapped (as another process
    rewriting an input would), polling /proc."""
    target = str(path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # the process not there yet, or a descriptor closed while listed
        if target in maps or target in fds:
            os.truncate(path, size)
            return
    raise AssertionError(f"{path} was never opened")


def test_an_input_truncated_while_it_is_read_is_unreadable_not_sigbus(tmp_path: Path) -> None:
    """A Parquet step truncated by another process the moment the build opens (or maps) it:
    before, the head-start hash and Polars mapped the file and the build died of SIGBUS;
    now the step is one unreadable_file line and the other step is built."""
    inputs = tmp_path / "in"
    generated_step(inputs, samples=8192)  # step=0.parquet, about 16 MiB
    write_step(inputs, ROWS, step=1)
    victim = inputs / "step=0.parquet"
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        code = "import sys\nfrom pipeline.cli import main\nsys.exit(main(sys.argv[1:]))"
        args = ["build", str(inputs), "--out", str(out), "--global-batch-size", "2"]
        began = time.monotonic()
        data = victim.read_bytes()
        process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        _truncate_when_touched(process.pid, victim, len(data) // (2 + attempt))
        _, stderr = process.communicate(timeout=60)
        seconds = time.monotonic() - began
        refused = [line for line in stderr.splitlines() if ": warning: " not in line]
        assert (process.returncode, seconds < 15, built(out)) == (1, True, ["step=1"]), stderr
        assert len(refused) == 1 and refused[0].startswith(
            f"{PROG}: build: step 0: {victim}: rule unreadable_file: "
        ), stderr
        victim.write_bytes(data)
