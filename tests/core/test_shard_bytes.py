"""The bytes a build writes: rank files equal to the digests recorded for these steps and
settings (a change of the shard bytes shows here first), and the manifest's digests are
those of the files. Polars 1.42 and 2.x write the same pages of the same values; the
bytes differ in the footer's `created_by` and in the runs that encode list columns'
repetition levels, so the file digests are recorded per Polars major version and the
decoded content (`parquet_pages.decoded`) once for both."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline.io.checksums import sha256_of
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.support.parquet_pages import decoded_digest
from tests.support.samples import generated_step, sample, write_step

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {
    "strided": {"global_batch_size": 64, "dp_size": 4},
    "balanced": {"global_batch_size": 64, "dp_size": 4, "balance_data": True},
}
POLARS_MAJOR = pl.__version__.split(".")[0]
# sha256 of rank=0..3 as Polars 2.1 writes them; they change only when the shard columns
# change on purpose (SEMANTICS 6.1's train_step; step, rank and every optional column).
BEFORE_2 = {
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


# The same files as Polars 1.42 writes them.
BEFORE_1 = {
    "compact-strided": [
        "c79aab52b6a7691987c65d81b7347537e41bda50677d12efe33d8636316ea74c",
        "6986ddc8c6469fdd00d0e86be2bdcee3b63582b85f716e10e5d013a729cf5045",
        "2be702558896d3e3c18829ac4e3207b84df2559e8d3dbff969e9017ef06ca080",
        "321099032db053e422188e98328b788f3908843bc0120b00d2db9d40f870a778",
    ],
    "compact-balanced": [
        "619f421ea08447878a4c113079595b78a8a4822c4e040b4cdde03241917d4148",
        "14e115d82d56f615b4ba587263a2a88e0e6c137dfa1b38231c4ace93fced94ef",
        "1f2c9dc0d6a2acb453a5b7a2a3feb0f7fa6fd1a82557798e7e9bcd66c400809b",
        "01388c5a3670101e253eac71e6d98c735b46231c4863cdc6dcbe1395cf290427",
    ],
    "non-compact-strided": [
        "f41f4884f810355a85fc5090a62cdb1182baac686602843e79450eded108303f",
        "a591b7a3068b726da5de9e676f2c177cf095eb78c0a44e98dcf540469eaf7432",
        "4cf2bee5459c125244cc498ff7bf1f2615e8799075d0185edb6d54b75213f3ac",
        "bcc61a37424574c72ab8e5e7697622513b4dc11c48c14ee837831d3261dade39",
    ],
    "non-compact-balanced": [
        "c1ead481a5cb936e44c515273a7615a3852d2b16cfbfe6f6a39c4df866999d9a",
        "a59f7e1d4fceb56c10a588a68a6376579b3f243a439ec58f538f00a4a88d3507",
        "0750ea032a1cc8ab928b6354dd651b31532c2ef9933320adae54226c54061ffa",
        "2c286d0a1d3b7aebfaee2b9a2c2d30ecca4c4a8f2eb959032435352fdc6a789a",
    ],
}
BEFORE = {"1": BEFORE_1, "2": BEFORE_2}
# `decoded_digest` of those rank files, the same under Polars 1.42 and 2.x.
DECODED = {
    "compact-strided": [
        "0a30fa2235bc6303f15ab53d62b949422d508eae8f7fba9e088fc1ea333fb808",
        "0fd3a5ce232357aabb22d37d6f49b0efffce3b33e7d827d7203143e08c1a933e",
        "c2368dcd0f3f7adcd00e8bfe5e990409de339d366ef4950403769131e532c686",
        "e4aa9aeb3eceb5715a2dc23277a76f26c258d137cc74902e7cb5724799cd72c8",
    ],
    "compact-balanced": [
        "34230c8c4311bbe43cc2298f58002aa1ff4f33b34c9bc72586894bb04112d60a",
        "c3c754f471d9df144ba4048c948bd9efcde466ba32b02df6ed19c8816dba34fd",
        "eea92822bec0492c4a08fdfebc60ea7f9848979ed73f0a4d9a2deef4deb64ea0",
        "2f73581868dbd39e0238399fce2628b7969f20587fd0d8c0030c5ac4c498a6f9",
    ],
    "non-compact-strided": [
        "adb29d36fb317dae581f70b2b16a8dbbf1e0b09f9d6e691a44421151d86ecb93",
        "a033a9f1f2cb73d313fc66f654b9f8a6055b79f759a4001f92a182567fdf92f9",
        "f77dc32c9e6b29fc65de9f11b75d05758303e433318d1536588340f4539bf9b1",
        "51f825d3f45806c0d9ecfd893d298ba5aaad3ff3a42b4f3bc81df1d16d1e3a48",
    ],
    "non-compact-balanced": [
        "f99e83bf1999221c13d0daf1c5545b2bba969c30e0f0bc459513f057fe928894",
        "cf7f809b346df6e99a8f5b3aef4eb73d717a115deca3300ac356d44b36a38e1c",
        "ff21091e14b6b01452b84aab37de89a53897b1d5868a51fefe60bc929a1e8617",
        "a88d18ca6f6a012be46edd5bb1ee422969998b6579637733ce55d1005e0299b5",
    ],
}
# `decoded_digest` of the rank files of data/rollouts' steps 1-4 with its settings.
SAMPLE_DECODED = {
    "sample-1": [
        "c0c7bf41c550624ff068211101ec453ad7fe59dd53b7c15aa7ec62526ea54173",
        "39adaf9b2e498274f4a301b915bac172b7676ddb78cb147417436318be434fe8",
    ],
    "sample-2": [
        "10351e22a4005f5e71028b6c9944de2141c0b443dcec6b2ef3379d4081ddae6a",
        "51a1ce730b96b4565f21f2cbe5e3d52f49f83113da7e9b38b38651784b62d0f0",
    ],
    "sample-3": [
        "4d8bb406533e33c7a84c8b08bb764b8ca5aafa30cf9fd3c8eff9a44c4abc2d44",
        "f2fc218ff70e995ddb2665fb5ee00efbdfff00fa099d6cd2bb2e341286d1f546",
    ],
    "sample-4": [
        "11b2b1af16f5455a9434d79b225a971391867eace17b72b9883cab6f92034dd2",
        "ee97ae72161c3eb60e5fbc72f8d3dfd8b1fc0688428ce4dbe60e911cad8118b7",
    ],
}


@pytest.mark.parametrize("kind", ["compact", "non-compact"])
def test_shards_are_the_bytes_written_before(tmp_path: Path, kind: str) -> None:
    inputs = generated_step(tmp_path / "in", non_compact=kind == "non-compact")
    sources = group_steps(find_sources([inputs]))[0]
    for name, settings in SETTINGS.items():
        manifest = build_step(0, sources, Settings(**settings), tmp_path / name)
        assert [o.path for o in manifest.outputs] == [f"rank={r}.parquet" for r in range(4)]
        assert [o.sha256 for o in manifest.outputs] == BEFORE[POLARS_MAJOR][f"{kind}-{name}"]
        folder = tmp_path / name / "step=0"
        assert [decoded_digest(folder / o.path) for o in manifest.outputs] == DECODED[
            f"{kind}-{name}"
        ], name


def test_the_sample_steps_hold_the_same_pages_on_every_polars(tmp_path: Path) -> None:
    """data/rollouts built with its settings: the rank files decode to the pages recorded,
    whichever supported Polars wrote them."""
    steps = group_steps(find_sources([REPO / "data" / "rollouts"]))
    settings = Settings(global_batch_size=8, dp_size=2, reward_key="score")
    assert sorted(steps) == [1, 2, 3, 4]
    for step, sources in sorted(steps.items()):
        manifest = build_step(step, sources, settings, tmp_path)
        folder = tmp_path / f"step={step}"
        digests = [decoded_digest(folder / o.path) for o in manifest.outputs]
        assert digests == SAMPLE_DECODED[f"sample-{step}"], step


def test_recorded_hashes_are_those_of_the_files(tmp_path: Path) -> None:
    """The writer hashes the bytes it writes; reading the files back gives the same."""
    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(16)])
    ((step, sources),) = group_steps(find_sources([tmp_path / "in"])).items()
    manifest = build_step(step, sources, Settings(global_batch_size=8, dp_size=2), tmp_path / "o")
    folder = tmp_path / "o" / f"step={step}"
    assert [o.sha256 for o in manifest.outputs] == [
        sha256_of(folder / o.path) for o in manifest.outputs
    ]
