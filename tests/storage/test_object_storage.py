"""Output roots in an S3-compatible store (moto's server on 127.0.0.1): the same bytes as a
local build, the manifest's conditional PUT as the commit (a crash before it leaves no
step, two racing builds give one step and one clean line), a reader that follows the
manifest and never a listing, abandoned attempts removed by the next build."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipeline.errors import StepError
from pipeline.io import storage
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.io.storage import ObjectRoot
from pipeline.io.store_layout import attempt_of, attempts_prefix, manifest_key, output_key
from pipeline.settings import make_settings
from pipeline.step import store_commit
from pipeline.step.build import build_step
from tests.support.cli import cli, digests
from tests.support.loader import bits
from tests.support.s3_server import S3Server, s3_server
from tests.support.samples import REPO

LOADER = REPO / "loader"
if str(LOADER) not in sys.path:
    sys.path.insert(0, str(LOADER))

from rollout_shards_loader import miles as miles_loader  # noqa: E402

ROLLOUTS = REPO / "data" / "rollouts"
STEPS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as running:
        yield running


def _build(server: S3Server, out: str | Path, *extra: str, env: dict[str, str] | None = None):
    result = cli("build", ROLLOUTS, "--out", out, *extra, env=env or server.env)
    return result


def _stored(server: S3Server, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix`, by its key below it."""
    return {
        key.removeprefix(prefix): server.body(bucket, key) for key in server.keys(bucket, prefix)
    }


# the second: the rollout-side schedule, whose blocking check reads the rank files' rows
@pytest.mark.parametrize("flags", [[], ["--cp-size", "2", "--micro-batch-size", "2"]])
def test_a_build_to_s3_stores_the_local_builds_bytes(
    server: S3Server, tmp_path: Path, flags: list[str]
) -> None:
    local = tmp_path / "local"
    assert _build(server, local, *flags).returncode == 0
    bucket = server.bucket()
    built = _build(server, f"s3://{bucket}/shards", *flags)
    assert built.returncode == 0, built.stderr
    assert "-> s3://" in built.stdout
    stored = _stored(server, bucket, "shards/")
    on_disk = {path: (local / path).read_bytes() for path in digests(local)}
    for step in STEPS:
        manifest = stored[manifest_key(step)]
        # the manifest, byte for byte the local one, names the attempt its files are under
        assert manifest == on_disk[f"step={step}/manifest.json"]
        attempt = attempt_of(manifest)
        for name in ("rank=0.parquet", "rank=1.parquet", "report.html"):
            key = output_key(step, attempt, name)
            assert stored[key] == on_disk[f"step={step}/{name}"]
    # nothing else: no card, no lock, no staging
    assert len(stored) == 4 * len(STEPS)

    again = _build(server, f"s3://{bucket}/shards", *flags)
    assert again.returncode == 0
    assert again.stdout.count("up to date, skipped") == len(STEPS)
    assert _stored(server, bucket, "shards/") == stored


def test_read_rank_from_s3_is_the_local_read(server: S3Server, tmp_path: Path) -> None:
    local = tmp_path / "local"
    bucket = server.bucket()
    assert _build(server, local).returncode == 0
    assert _build(server, f"s3://{bucket}/root").returncode == 0
    for step in STEPS:
        for rank in (0, 1):
            want = miles_loader.read_rank(local / f"step={step}", rank)
            got = miles_loader.read_rank(f"s3://{bucket}/root/step={step}", rank)
            assert bits(got) == bits(want)


def test_a_crash_before_the_manifest_leaves_no_step(server: S3Server) -> None:
    bucket = server.bucket()
    root = f"s3://{bucket}/crash"
    # the process dies (no cleanup, no exception) right before its first commit
    crash = textwrap.dedent(
        f"""
        import os, sys
        from pipeline.io import storage
        storage.put_if = lambda *args, **kwargs: os._exit(9)
        from pipeline.cli import main
        sys.argv = ["rollout-shards", "build", {str(ROLLOUTS / "step=1.parquet")!r},
                    "--out", {root!r}, "--dp-size", "4"]
        main()
        """
    )
    died = subprocess.run(
        [sys.executable, "-c", crash], cwd=REPO, env=server.env, capture_output=True, text=True
    )
    assert died.returncode == 9, died.stderr
    left = server.keys(bucket, "crash/")
    assert left and all("/_attempts/" in key for key in left)  # files, no manifest
    with pytest.raises(FileNotFoundError, match="no manifest, so .* is not a complete step"):
        miles_loader.read_rank(f"{root}/step=1", 0)

    # the next build keeps another build's files while they may be written (the grace)...
    kept = _build(server, root, env=server.env)
    assert kept.returncode == 0
    assert set(left) <= set(server.keys(bucket, "crash/"))
    # ...and removes them once they are older than it
    env = dict(server.env, **{store_commit.ABANDONED_ENV: "0"})
    assert _build(server, root, env=env).returncode == 0
    remaining = server.keys(bucket, "crash/")
    assert not set(left) & set(remaining)
    step_1 = [key for key in remaining if key.startswith("crash/step=1/")]
    assert len(step_1) == 4  # the manifest and the two rank files and report it names
    assert miles_loader.read_rank(f"{root}/step=1", 1)["tokens"]


def test_two_builds_racing_commit_one_step_and_one_line(server: S3Server) -> None:
    bucket = server.bucket()
    root = f"s3://{bucket}/race"
    # builder A is about to commit when builder B (other settings) commits first
    racing = textwrap.dedent(
        f"""
        import subprocess, sys
        from pipeline.io import storage
        real = storage.put_if
        def late(*args, **kwargs):
            other = subprocess.run([sys.executable, "-m", "pipeline.cli", "build",
                {str(ROLLOUTS / "step=1.parquet")!r}, "--out", {root!r}, "--dp-size", "4"])
            assert other.returncode == 0
            return real(*args, **kwargs)
        storage.put_if = late
        from pipeline.cli import main
        sys.argv = ["rollout-shards", "build", {str(ROLLOUTS / "step=1.parquet")!r},
                    "--out", {root!r}]
        main()
        """
    )
    lost = subprocess.run(
        [sys.executable, "-c", racing], cwd=REPO, env=server.env, capture_output=True, text=True
    )
    assert lost.returncode == 1
    lines = lost.stderr.strip().splitlines()
    assert len(lines) == 1 and "step_committed_concurrently" in lines[0], lost.stderr
    assert "Traceback" not in lost.stderr
    # the winner's step stands whole; the loser's files are gone
    keys = server.keys(bucket, "race/step=1/")
    winner = server.body(bucket, "race/" + manifest_key(1))
    attempt = attempt_of(winner)
    assert keys == sorted(
        ["race/" + manifest_key(1)]
        + ["race/" + output_key(1, attempt, f"rank={r}.parquet") for r in range(4)]
        + ["race/" + output_key(1, attempt, "report.html")]
    )
    assert len(miles_loader.read_rank(f"{root}/step=1", 3)["tokens"]) > 0


def test_the_loser_of_a_replace_is_refused_in_process(server: S3Server) -> None:
    """Two builds that saw the same manifest: the first to replace it wins (If-Match)."""
    bucket = server.bucket()
    root = ObjectRoot(f"s3://{bucket}/replace")
    assert _build(server, root.uri).returncode == 0
    first = storage.get(root, manifest_key(1))
    assert first is not None
    replaced = first.data + b" "
    assert storage.put_if(root, manifest_key(1), replaced, first.etag)  # replaced once
    # a second writer with the old etag loses, and a create loses too
    assert not storage.put_if(root, manifest_key(1), b"{}", first.etag)
    assert not storage.put_if(root, manifest_key(1), b"{}", None)
    assert storage.get(root, manifest_key(1)).data == replaced  # type: ignore[union-attr]


def test_a_reader_follows_the_manifest_never_a_listing(server: S3Server, tmp_path: Path) -> None:
    """What a listing shows (stale or early files: a replaced build's attempt, stray rank
    files beside the manifest) never reaches a read: it opens the files the manifest names."""
    bucket = server.bucket()
    root = ObjectRoot(f"s3://{bucket}/lag")
    assert _build(server, root.uri, "--dp-size", "2").returncode == 0
    old_attempt = attempt_of(storage.get(root, manifest_key(2)).data)  # type: ignore[union-attr]
    assert _build(server, root.uri, "--global-batch-size", "4", "--force").returncode == 0
    new = storage.get(root, manifest_key(2))
    assert new is not None and attempt_of(new.data) != old_attempt
    # a lagging listing of the step: the old attempt, and files no build committed
    old_rank = storage.get(root, output_key(2, old_attempt, "rank=0.parquet"))
    assert old_rank is not None
    storage.put(root, "step=2/rank=0.parquet", old_rank.data)
    storage.put(root, f"{attempts_prefix(2)}ffffffffffffffff/rank=0.parquet", old_rank.data)
    listed = {item.key for item in storage.listing(root, "step=2/")}
    assert output_key(2, old_attempt, "rank=0.parquet") in listed
    got = miles_loader.read_rank(f"{root.uri}/step=2", 0, global_batch_size=4)
    assert _build(server, tmp_path / "new", "--global-batch-size", "4").returncode == 0
    assert bits(got) == bits(miles_loader.read_rank(tmp_path / "new" / "step=2", 0))
    # the manifest names its own files, checked by sha256: old bytes there would be refused
    assert storage.get(root, output_key(2, attempt_of(new.data), "rank=0.parquet")) is not None


def test_a_lost_race_in_process_removes_its_files(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = server.bucket()
    root = ObjectRoot(f"s3://{bucket}/inproc")
    assert _build(server, root.uri, "--dp-size", "4").returncode == 0
    before = set(server.keys(bucket, "inproc/"))
    real = storage.put_if

    def someone_else_first(where: ObjectRoot, key: str, data: bytes, etag: Any) -> bool:
        assert real(where, key, b'{"another": "build"}', etag)  # wins with the same etag
        return real(where, key, data, etag)

    monkeypatch.setattr(storage, "put_if", someone_else_first)
    sources = group_steps(find_sources([ROLLOUTS / "step=1.parquet"]))[1]
    settings = make_settings({"global_batch_size": 8, "dp_size": 2, "reward_key": "score"})
    with pytest.raises(StepError) as refused:
        build_step(1, sources, settings, root)
    assert [v.rule for v in refused.value.violations] == [store_commit.RACE_RULE]
    # its two rank files were uploaded, then removed: the keys are the winner's alone
    assert set(server.keys(bucket, "inproc/")) == before
    assert server.body(bucket, "inproc/" + manifest_key(1)) == b'{"another": "build"}'


def _upload(server: S3Server, bucket: str, prefix: str) -> None:
    """data/rollouts into the store, every file under its path there."""
    client = server.client()
    for path in sorted(ROLLOUTS.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(ROLLOUTS)}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


def test_a_build_reads_its_rollouts_from_s3(server: S3Server, tmp_path: Path) -> None:
    bucket = server.bucket()
    _upload(server, bucket, "rollouts")
    local = tmp_path / "local"
    assert _build(server, local).returncode == 0
    remote_in = f"s3://{bucket}/rollouts"
    from_store = tmp_path / "from-store"
    built = cli("build", remote_in, "--out", from_store, env=server.env)
    assert built.returncode == 0, built.stderr
    assert built.stdout.count("written to 2 ranks") == len(STEPS)
    # the same shards; the manifests differ only in the inputs' paths (URLs there)
    for step in STEPS:
        for rank in (0, 1):
            name = f"step={step}/rank={rank}.parquet"
            assert (from_store / name).read_bytes() == (local / name).read_bytes()
        manifest = json.loads((from_store / f"step={step}/manifest.json").read_text())
        assert all(i["path"].startswith(f"{remote_in}/step={step}") for i in manifest["inputs"])
    # from the store to the store: the same again, and current on the next run
    out = f"s3://{bucket}/shards"
    assert cli("build", remote_in, "--out", out, env=server.env).returncode == 0
    for step in STEPS:
        stored = server.body(bucket, f"shards/{manifest_key(step)}")
        assert stored == (from_store / f"step={step}/manifest.json").read_bytes()
    again = cli("build", remote_in, "--out", out, env=server.env)
    assert again.stdout.count("up to date, skipped") == len(STEPS)
    checked = cli("validate", remote_in, env=server.env)
    assert checked.returncode == 0, checked.stderr


def test_metrics_of_a_root_in_the_store(server: S3Server, tmp_path: Path) -> None:
    bucket = server.bucket()
    local = tmp_path / "local"
    assert _build(server, local).returncode == 0
    assert _build(server, f"s3://{bucket}/m").returncode == 0
    want = cli("metrics", local, "--jsonl", "-", env=server.env)
    got = cli("metrics", f"s3://{bucket}/m", "--jsonl", "-", env=server.env)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout and got.stdout.count("\n") == len(STEPS)
    empty = cli("metrics", f"s3://{bucket}/nothing", env=server.env)
    assert empty.returncode != 0 and "no committed step" in empty.stderr


def test_parity_of_builds_and_inputs_in_the_store(server: S3Server, tmp_path: Path) -> None:
    bucket = server.bucket()
    local = tmp_path / "local"
    assert _build(server, local).returncode == 0
    assert _build(server, f"s3://{bucket}/p").returncode == 0
    same = cli("parity", local, f"s3://{bucket}/p", env=server.env)
    assert same.returncode == 0, same.stdout + same.stderr
    one = tmp_path / "one"
    one.mkdir()
    (one / "step=1.parquet").write_bytes((ROLLOUTS / "step=1.parquet").read_bytes())
    server.client().put_object(
        Bucket=bucket, Key="one/step=1.parquet", Body=(one / "step=1.parquet").read_bytes()
    )
    inputs = cli("parity", one, f"s3://{bucket}/one", env=server.env)
    assert inputs.returncode == 0, inputs.stdout + inputs.stderr
    assert "identical" in inputs.stdout
    other = tmp_path / "other"
    assert _build(server, other, "--global-batch-size", "4").returncode == 0
    differs = cli("parity", other, f"s3://{bucket}/p", env=server.env)
    assert differs.returncode == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["build", str(ROLLOUTS), "--out", "s3://no-such-bucket/x"], "--out s3://no-such"),
        (["build", "s3://no-such-bucket/in", "--out", "OUT"], "input s3://no-such-bucket/in"),
        (["build", str(ROLLOUTS), "--out", "s3://"], "name a bucket"),
    ],
)
def test_a_store_it_cannot_reach_is_one_line(
    server: S3Server, tmp_path: Path, args: list[str], said: str
) -> None:
    given = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    result = cli(*given, env=server.env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_set_aside_rows_are_stored_as_on_disk(server: S3Server, tmp_path: Path) -> None:
    """A step with a quarantine: its file under the attempt, byte for byte the local one."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    frame = pl.read_parquet(ROLLOUTS / "step=1.parquet")
    broken = frame.with_columns(
        pl.when(pl.col("index") == frame.get_column("index")[0])
        .then(pl.lit(10_000, dtype=frame.schema["response_length"]))
        .otherwise(pl.col("response_length"))
        .alias("response_length")
    )
    broken.write_parquet(inputs / "step=1.parquet")
    flags = ["--on-invalid", "quarantine", "--global-batch-size", "4", "--dp-size", "2"]
    flags += ["--reward-key", "score"]
    local = tmp_path / "local"
    assert cli("build", inputs, "--out", local, *flags, env=server.env).returncode == 0
    bucket = server.bucket()
    built = cli("build", inputs, "--out", f"s3://{bucket}/q", *flags, env=server.env)
    assert built.returncode == 0, built.stderr
    manifest = server.body(bucket, "q/" + manifest_key(1))
    assert manifest == (local / "step=1" / "manifest.json").read_bytes()
    assert json.loads(manifest)["counts"]["quarantined"] > 0
    key = output_key(1, attempt_of(manifest), "../_quarantine/step=1.parquet")
    assert (
        server.body(bucket, "q/" + key) == (local / "_quarantine" / "step=1.parquet").read_bytes()
    )
    assert f"s3://{bucket}/q/{key}" in built.stderr  # where the build says they went


def test_a_read_during_a_rebuild_starts_over_on_the_new_step(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step is replaced and its old files removed between the reader's GET of the
    manifest and of its rank file: the read starts over and gives the new build's rows."""
    from rollout_shards_loader import _remote

    bucket = server.bucket()
    root = f"s3://{bucket}/moving"
    assert _build(server, root).returncode == 0
    real = _remote.RemoteFolder._get
    rebuilt: list[bool] = []
    fetched: list[str] = []

    def rebuild_first(folder: _remote.RemoteFolder, name: str) -> bytes:
        fetched.append(name)
        if name != "manifest.json" and not rebuilt:
            rebuilt.append(True)
            assert _build(server, root, "--global-batch-size", "4", "--force").returncode == 0
            env = dict(server.env, **{store_commit.ABANDONED_ENV: "0"})
            assert _build(server, root, "--global-batch-size", "4", env=env).returncode == 0
        return real(folder, name)

    monkeypatch.setattr(_remote.RemoteFolder, "_get", rebuild_first)
    got = miles_loader.read_rank(f"{root}/step=2", 1)
    # the manifest, the old rank file (gone), the manifest again (replaced), then the new
    assert fetched[:4] == ["manifest.json", "rank=1.parquet", "manifest.json", "manifest.json"]
    assert _build(server, tmp_path / "new", "--global-batch-size", "4").returncode == 0
    assert bits(got) == bits(miles_loader.read_rank(tmp_path / "new" / "step=2", 1))


def _requests(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """The requests the server logged since the last clear, by kind (a LIST is a GET of
    the bucket with `list-type`)."""
    found = re.findall(r"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP", caplog.text)
    caplog.clear()
    return Counter(verb + (" LIST" if "list-type" in url else "") for verb, url in found)


def test_the_requests_per_step_are_the_documented_ones(
    server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/deploy.md's table, counted at the server: a new step of 2 ranks, a current one,
    and one rank's read."""
    caplog.set_level(logging.INFO, logger="werkzeug")
    bucket = server.bucket()
    root = f"s3://{bucket}/count"
    caplog.clear()
    assert _build(server, root).returncode == 0
    steps = len(STEPS)
    # the root's reachability; per step: GET manifest (404), LIST attempts, 2 ranks + the
    # report + the manifest PUT
    assert _requests(caplog) == Counter({"GET LIST": 1 + steps, "GET": steps, "PUT": 4 * steps})
    assert _build(server, root).returncode == 0
    # per step: GET manifest, LIST attempts, LIST the manifest's attempt
    assert _requests(caplog) == Counter({"GET LIST": 1 + 2 * steps, "GET": steps})
    miles_loader.read_rank(f"{root}/step=1", 0)
    # pyarrow: HEAD + GET of the manifest and of the own file; HEAD + 2 ranged GETs of the
    # other rank's small file (footer, then the two columns)
    assert _requests(caplog) == Counter({"HEAD": 3, "GET": 4})


def _tensor_bits(value: Any) -> Any:
    """`bits` of a value that may be a tensor or a list of tensors: dtype, shape, bytes."""
    import torch

    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.contiguous().numpy().tobytes())
    if isinstance(value, list):
        return [_tensor_bits(item) for item in value]
    return bits(value)


def test_slimes_read_rank_from_s3_is_the_local_read(server: S3Server, tmp_path: Path) -> None:
    """Another trainer's reader through the same remote read (slime's dict per rank)."""
    from rollout_shards_loader import slime as slime_loader

    flags = ["--trainer", "slime", "--rollout-batch-size", "8"]
    bucket = server.bucket()
    local = tmp_path / "local"
    assert _build(server, local, *flags).returncode == 0
    assert _build(server, f"s3://{bucket}/slime", *flags).returncode == 0
    for step in STEPS:
        for rank in (0, 1):
            want = slime_loader.read_rank(local / f"step={step}", rank)
            got = slime_loader.read_rank(f"s3://{bucket}/slime/step={step}", rank)
            assert list(got) == list(want)
            for key, value in want.items():
                assert _tensor_bits(got[key]) == _tensor_bits(value), key
