"""The bytes a build writes: rank files equal to the digests recorded for these steps and
settings (a change of the shard bytes shows here first), and the manifest's digests are
those of the files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.io.checksums import sha256_of
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.conftest import sample, write_step

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {
    "strided": {"global_batch_size": 64, "dp_size": 4},
    "balanced": {"global_batch_size": 64, "dp_size": 4, "balance_data": True},
}
# sha256 of rank=0..3 as Polars 2.1 writes them; they change only when the shard columns
# change on purpose (SEMANTICS 6.1's train_step; step, rank and every optional column).
BEFORE = {
    "compact-strided": [
        "1af73db0fbae5e202d7fc320799f406436838f1b2ef5ab3751c874f0570c5e8e",
        "52b7b4b82c6c225482fcc4e5fec3fb79cdbaa16be2a9e1a76864bd5fa31c0cbd",
        "834fdb30dcfa2d93a4ced4c2014038083ddee01f3f27509995f6d20af6485ad3",
        "a28bdbe6b9fbcbe328527fcf8600be9aff0c2747713e274e867c8d735a7931d8",
    ],
    "compact-balanced": [
        "c23fbafb8e89711a073221178137fa76b55ee251dc0a5bc8c0e618aa1662b3ac",
        "9fdf150d257a7ff76669a15890969f5847ce12163c628ddff269e3d456902e13",
        "1bbfada8ec1eea05aa11140ac13e2bcb4ba08abb049e9b6e7b8a1bb9ad976ca6",
        "24e94868824a9d09ddcf35cad7ef64d8119c3e318386a9077ad6da19c6858101",
    ],
    "non-compact-strided": [
        "57d740dc8f1d17cd7bf0a8ab68b479dbbd975d5e6c6188a125f4ca110b106e5e",
        "eb1cba83140ea6a1256a60e527cebe7600c21e7cef7774e3df5a17b913924c45",
        "35c3d3892ef04e358e6ea13e4edb5ddb161ee1e32493097891c39d3078031ba2",
        "40ecd33c7c53500f4695338d790367b95c81fe0f81e2ef5a0343640398fb19a3",
    ],
    "non-compact-balanced": [
        "fb03da70e37b3f0b57dfbeb8ce80769ae12379c7d97e48f1434f95c542e31e86",
        "bf01c18cf7661dcef3899b27c55f4ad335debf966ab231ff5bf0b4fb9cc4087e",
        "b3d62aa13b3f66e22f187aa1b0cad6ea98b5dd20020dae27120455597ce6f04e",
        "9358bf127560088e433be0887913b909efcde3dfe2528c38d75a5f46147d7974",
    ],
}


def _generated(folder: Path, non_compact: bool) -> Path:
    spec = importlib.util.spec_from_file_location("bench_generate", REPO / "bench" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    mix = generate.parse_mix(generate.DEFAULT_MIX, non_compact)
    table = generate.generate_step(0, 3000, 400.0, mix, 8, 0.3, 7, True)
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "step=0.parquet")
    return folder


@pytest.mark.parametrize("kind", ["compact", "non-compact"])
def test_shards_are_the_bytes_written_before(tmp_path: Path, kind: str) -> None:
    inputs = _generated(tmp_path / "in", non_compact=kind == "non-compact")
    sources = group_steps(find_sources([inputs]))[0]
    for name, settings in SETTINGS.items():
        manifest = build_step(0, sources, Settings(**settings), tmp_path / name)
        assert [o.path for o in manifest.outputs] == [f"rank={r}.parquet" for r in range(4)]
        assert [o.sha256 for o in manifest.outputs] == BEFORE[f"{kind}-{name}"], name


def test_recorded_hashes_are_those_of_the_files(tmp_path: Path) -> None:
    """The writer hashes the bytes it writes; reading the files back gives the same."""
    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(16)])
    ((step, sources),) = group_steps(find_sources([tmp_path / "in"])).items()
    manifest = build_step(step, sources, Settings(global_batch_size=8, dp_size=2), tmp_path / "o")
    folder = tmp_path / "o" / f"step={step}"
    assert [o.sha256 for o in manifest.outputs] == [
        sha256_of(folder / o.path) for o in manifest.outputs
    ]
