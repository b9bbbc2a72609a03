"""The bytes a build writes: rank files equal to the digests recorded for these steps and
settings (a change of the shard bytes shows here first), and the manifest's digests are
those of the files. Polars 1.42 through 2.1 write the same pages of the same values; the
bytes differ in the footer's `created_by` and in the runs that encode list columns'
repetition levels, so the file digests are recorded per Polars line and the decoded content
(`parquet_pages.decoded`) once for them. Polars 2.2 cuts a row group's pages otherwise:
its files and decoded content are recorded apart."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline.io.checksums import sha256_of
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.io.writer import PARQUET_OPTIONS, ROW_GROUP
from pipeline.settings import Settings
from pipeline.step.build import build_step
from tests.support.parquet_pages import decoded_digest
from tests.support.samples import generated_step, sample, write_step

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {
    "strided": {"global_batch_size": 64, "dp_size": 4},
    "balanced": {"global_batch_size": 64, "dp_size": 4, "balance_data": True},
}
POLARS = tuple(int(part) for part in pl.__version__.split(".")[:2])
# Polars 2.2 cuts a row group's pages alike whatever buffers its rows are in; before it, a
# row group's pages were sized by the buffers it was cut from.
PAGES_BY_BUFFERS = POLARS < (2, 2)
# The Polars versions whose shard bytes are recorded: 1.42, 2.0 and 2.1 (the same pages),
# 2.2 on.
POLARS_LINE = "1" if POLARS[0] == 1 else "2.1" if PAGES_BY_BUFFERS else "2.2"
# sha256 of rank=0..3 as Polars 2.1 writes them; they change only when the shard columns
# change on purpose (SEMANTICS 6.1's train_step; step, rank and every optional column;
# miles' two sampling-mask columns; last: miles' weight_version_spans, null in these steps,
# the rest of each file unchanged).
BEFORE_2 = {
    "compact-strided": [
        "8e75f0bfb9a2071e71660cc6c873ccee7c9141e7ff161d75981022700c3ac6a6",
        "cf050eef1090366daced82005463cef35e3961544c7c04b167be4fddeb57d9b9",
        "6713bbddde7ca823725c779413f9635748730fd2742fb75daf9e6747ec3c11a6",
        "478ad791a01bee86352cfbdc2411672460709ea8b279311469fbe27fe32e5caa",
    ],
    "compact-balanced": [
        "c4e8474c3f3a5785877ffc75caeadd1c3aca72e5436d2634fd69ccbce3937008",
        "6eefa45db23157927a1ce6fdd8e4c4870603e12538dbbbac4e2ace467c6a03da",
        "4e57737bb86cd622d3f08f624fbd02e977fdf5c590e6351e4586f3bf645cc480",
        "3be444c9edaca159fb2d204c15fe173ccef51b0c516fb4a4898bb7cb95abd0a7",
    ],
    "non-compact-strided": [
        "d137d02f80c6ab580eb80887087f4f5e25a6ab6fbc11da5034f1794ae3192a4f",
        "1316b30647e5b3a3d2d449a08c4e340d9906fa12f19886beef4dd708af837934",
        "875d97958dd96a5d0182bdeeada786e5c01c13f6c5a99c32f25ab97a7f65b093",
        "586120f4bae0318e21144815b913531e8d84cc94565630955334ff8920afca3f",
    ],
    "non-compact-balanced": [
        "9bb29055511406ecaa624a85f2be084e1376316b83c2ed60ca26845cbf4a7074",
        "e8e71b90cc006af71b74c49a5587da25a93f15cdb0450cae0ab55f687f179316",
        "7bcf456fd1ddcd354884cc75b3e708d6ad94c7675b15ff358bcd3a999715d08f",
        "ba7763b2d9d58f0329519e51c41c135a668d306bbc47763c537be4894d60b9c3",
    ],
}


# The same files as Polars 1.42 writes them.
BEFORE_1 = {
    "compact-strided": [
        "8d5de6633847dec8c2ed53d7bbcd22d93ba1b00652af022fefe6c201b44e99d3",
        "75294a99ae98dc80628a9ea96fea7938c450766913562bf01f7a6ee91638b852",
        "8ef264e59e6a2fa21d7d17636e113fe77359dab29e85db1ce7583606dc109d0f",
        "4f123ac5617f76b4ff1688b9a8766225ab42125f5e4054a2eee53b64b580a94d",
    ],
    "compact-balanced": [
        "20aded40a5b0443c1dccc0bedcb2e8df1efb4d7e1c4e223a4ac1078d9fb52e46",
        "f90024371d77b24b0041606161001a04beb71ce0f193d273fb2ffc9f79103c38",
        "80db9191e8963bb233e02b1b667aaea57b98433f7b5e0d5cb6b8bbb732616b76",
        "0a14eb9da3dacc25ec9d9ccf9a5dc5c0124c194ce8091d1ce006f323ea131141",
    ],
    "non-compact-strided": [
        "80d455ee4234f94027d8d726da1a5edf6992b2d68e0b9173c5bdbf710ac7b952",
        "a2785fb5b22f518799a9e6dc837153f303f70484bc9a1e159237c0a85d6f98e9",
        "5ad2cf9ae8ef759a12329e15c2e5240c3db1dbd10c122f5f7d54c5da0fa02ed1",
        "bc185d1ecf127b46642142acbd7cd4dae242e968abe5952d815ff2c4bc186eee",
    ],
    "non-compact-balanced": [
        "3748bad93f884b3e6fd9e1ae23859d60ce4d1e0d5954bbdadbdefeb498960709",
        "5348bdaf223bfb8906324296371c0bbb0bfc158d0ec9502407dcee2e73feb341",
        "a0058d2ab4a2d2caa52e23104c84a41251c47cc6d3aee698fca5aeeb4051c043",
        "a54827e2df7a8775da10e878d27ff9f34e6830105398272abd19fb62b3d1ca09",
    ],
}
# The same files as Polars 2.2 writes them.
BEFORE_22 = {
    "compact-strided": [
        "e471b740616acbcb3d83b5fe57c56df809aca3854caa90d2bf8e1a103ed0f1d2",
        "3e9ad205391095959ecfdb12b6dc6a4c3d72d2ee29df4fbdec6110d3f1bf9ce0",
        "0a23e5e4ada612ca26e40c0cf8d0d1b0a44a91477c061b9a54e68b7c9dda2e21",
        "959babc9d84ed3de209a8667cc49e4eaad08a364dc80a798795c9cab04fd2fdc",
    ],
    "compact-balanced": [
        "18b328da8d47fa9287dd54fe27fef87f493539aeb494ae219a16326bff3bea69",
        "79bfeac252e585db191a93a038ac4c5191c8a006948286ab3f9d2869d1d6c476",
        "241e36965c14c10398fd7d66810fe01bc8e2ad4adc938303b7ca638be2c4e9c6",
        "846d863ff74c774750079a4e185e4f7a15c4dbd9bf5551124fe6e284085e8868",
    ],
    "non-compact-strided": [
        "090e4ff0bf4acd3059a9925d7855fd384fbd393f212a10137fe305b676f01599",
        "a0c81c90f5dc814bce411089bd86b2fc8d51e1c2b56018b6d0e037948b48444e",
        "4ccb8f316cf53f36fcb4253f9614e27b6659b32f6bc36b9217a4bfcdcf26a87c",
        "082cd0836b975fe3318c449e95ac3b02876b7571f2f28526355c848b37c575f7",
    ],
    "non-compact-balanced": [
        "a513ec4b7aa6c3660202beb7e21072b460693c456e2c76997d4634eaa1e20aba",
        "6877819f752f78663d3fb960a47d1a0561ad7b636f91c6f5bc0b9151ddc31137",
        "43f8e7256b40d0c472c137e8218dbd0664c480fc81ed71ad0a57d3382a1cf675",
        "87fb98ff68756c67b4a1992850f1452d5839111624a282047f43f9d141e198cf",
    ],
}
# `decoded_digest` of those rank files as Polars 2.2 writes them.
DECODED_22 = {
    "compact-strided": [
        "48155382e7c6a8a386b6c13b66e2fc61ea87195522f95be0e5e34f349c45c4ff",
        "5a9191ef4333bc0649af0bfef7404528e1f5f3b9ad480022163a6d5044ea90c0",
        "7fd2116eeff1fba768a5d9459cdbe53104814a8467e627a0742818e4959ae940",
        "b079605854c01c078b848cd3de3477e1aaceea9406527c95a513a8f5fd2c9f46",
    ],
    "compact-balanced": [
        "cf64b09cc20d6108f9a2bb16d8e1148938e8bc1757a9533a65e9262794795a8d",
        "fc0d67c86b4869573d83937244cdafba4d187245a416dc78fda0835e2e055977",
        "2615b6bcef30c3edea4593c6a06c053e5af138d47b7f31e269033d6e8d0cedef",
        "f5d3b76453a46c92be2676d45d1a0242b5149fb26723dc04f8ed21cf1034cd11",
    ],
    "non-compact-strided": [
        "c0941004f044685375a9f6645c5c539ed323ef01d6840a76cd25a9b7eef81424",
        "6d6f5960f6ab505605aa2a5fac7cf10a6b4d48bfc033b584f17f4b15d1568d63",
        "2afda24e260c2633c808f022d46f657e2bb97ffe3655c1fcf71d3cfdbd2022ea",
        "dbc97ed4128a5b3ec41766311fecf9e29ac413e5104ee5e24053c9b7a48475dc",
    ],
    "non-compact-balanced": [
        "17faacf2316f0e340a8cb937283c7f27bdf816e0f97f5a99552f2ba29214d2ee",
        "e108b99360a836cbd81ad88541e813a0e37bbe2a2964b5c10dfdf3fdc3771fa9",
        "fbbd5e1261c1af1929ca4b651218c7c6b60cc2a45e38a124911afa026c727ba4",
        "0ca25c5adcf4ca9938dc94089ea0749a096235130270701fc35033949b084b15",
    ],
}
BEFORE = {"1": BEFORE_1, "2.1": BEFORE_2, "2.2": BEFORE_22}
# `decoded_digest` of those rank files, the same under Polars 1.42 through 2.1.
DECODED = {
    "compact-strided": [
        "87b0be92b3d77b1e839fcea99e6788f96be5c1d687c0dea7709b712e4b34cfd5",
        "f87423baea61c3757a35feeb56764f5c1b1394bde1df616a68885609b48716d6",
        "ff20c5830bf22b3fed3bd2dd63211bb22b4bf3bd5db2c26d4b55d9152a71aefb",
        "679d49e0a34af44331fec16305b0bf69dbbc4fd4b0eacaff1d6bcaf79dd0b1af",
    ],
    "compact-balanced": [
        "3dbf2e8f2fd0dc5dcc2f295e66c99299d22d61a892ff5976223baca5c5dfff2a",
        "ac7c68ccb22f1236b604b704d13e20be5c948a0618505361f5e06722cdad918c",
        "f9cebfa6c45e2b7b98de3fe38f765958f33d3ab7f6764bd77f6cda1b80ebeff6",
        "12f99eb4d1058d8f921d018bda86c361a82eba10b2ffeeefc1e1abe1cdb7130c",
    ],
    "non-compact-strided": [
        "1298b8909bac08d3e889235b56489979a8b580c64e6111a5db600636301031c8",
        "b0d97f1a9d0ab335a4fb0d921e9d471245b76d6f75f6649dd948d40f92c57802",
        "26df5c38b16fd8eb95fa760dbe465c956370c592695629db6009ca3b9b01556f",
        "1168b36021d0d9f29642075a3fad1b62abd129bdbac160d75a75d08be1971084",
    ],
    "non-compact-balanced": [
        "8e0b49d54297d8eb8e3f40d6b8454be78bc3065bde9ff938634e49e6938a84c2",
        "5f7492553c8db5338787f41d4c0f89dc02309997cb20641e684915754398f9f0",
        "c1e72d6f16e890c8ded61512e741402e8627312dc496085b30048040ffec3482",
        "5445197ef73c64882d3309435ee4bca9f5a597f89e0e27b20dd91805a2ada5be",
    ],
}
# `decoded_digest` of the rank files of data/rollouts' steps 1-4 with its settings.
SAMPLE_DECODED = {
    "sample-1": [
        "1664be04b10bd314c992d15c924a201378fb83bc9fe505661bfbe79a9380466e",
        "4cd66bf16fa2e5af91a0efec67fe12b45ec8204b74399295924aa2a8c9ebc37c",
    ],
    "sample-2": [
        "760c962416e6271d6e1d695ef0fa27fb86a6dcec410fbbb3159cc29226dd62af",
        "061003255b1491322dec7278a39b4adb1e4cff7ceb325846aa20eb6d15492232",
    ],
    "sample-3": [
        "cf507305c909589cdc5e6b8855d0c958f2319eb27411603cb2f1b85e363e6907",
        "4d457a3cf8beb69c103af26d68a3435f1edc971ad358d76499a8b8c699ff6253",
    ],
    "sample-4": [
        "fa62d71072737d51c21aca74ec676376e48644437aac8aeab0dfc3b562a28cc6",
        "10f4b86eb92d93cfa759307a89d7f98f6b5bb7e97743d45f32076595a1391375",
    ],
}


@pytest.mark.parametrize("kind", ["compact", "non-compact"])
def test_shards_are_the_bytes_written_before(tmp_path: Path, kind: str) -> None:
    inputs = generated_step(tmp_path / "in", non_compact=kind == "non-compact")
    sources = group_steps(find_sources([inputs]))[0]
    for name, settings in SETTINGS.items():
        manifest = build_step(0, sources, Settings(**settings), tmp_path / name)
        ranks = manifest.rank_outputs()  # then the report (tests/core/test_report.py)
        assert [o.path for o in manifest.outputs] == [o.path for o in ranks] + ["report.html"]
        assert [o.path for o in ranks] == [f"rank={r}.parquet" for r in range(4)]
        assert [o.sha256 for o in ranks] == BEFORE[POLARS_LINE][f"{kind}-{name}"]
        folder = tmp_path / name / "step=0"
        decoded = DECODED if PAGES_BY_BUFFERS else DECODED_22
        assert [decoded_digest(folder / o.path) for o in ranks] == decoded[f"{kind}-{name}"], name


def test_the_sample_steps_hold_the_same_pages_on_every_polars(tmp_path: Path) -> None:
    """data/rollouts built with its settings: the rank files decode to the pages recorded,
    whichever supported Polars wrote them."""
    steps = group_steps(find_sources([REPO / "data" / "rollouts"]))
    settings = Settings(global_batch_size=8, dp_size=2, reward_key="score")
    assert sorted(steps) == [1, 2, 3, 4]
    for step, sources in sorted(steps.items()):
        manifest = build_step(step, sources, settings, tmp_path)
        folder = tmp_path / f"step={step}"
        digests = [decoded_digest(folder / o.path) for o in manifest.rank_outputs()]
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


def test_a_rank_file_is_its_row_groups_written_each_from_buffers_of_its_own(
    tmp_path: Path,
) -> None:
    """Polars before 2.2 sizes a row group's pages by the buffers it is cut from. A rank
    file of several row groups holds the bytes Polars writes from each group's rows copied
    alone, whichever path gathered them: there, fewer, larger pages than one buffer cut
    into groups; from Polars 2.2 on, the pages of one buffer."""
    inputs = generated_step(tmp_path / "in", non_compact=True)
    sources = group_steps(find_sources([inputs]))[0]
    build_step(0, sources, Settings(global_batch_size=64, dp_size=2), tmp_path / "out")
    built = tmp_path / "out" / "step=0" / "rank=0.parquet"
    rows = pl.read_parquet(built)
    assert rows.height > ROW_GROUP
    starts = range(0, rows.height, ROW_GROUP)
    alone = [rows[pl.int_range(s, min(s + ROW_GROUP, rows.height), eager=True)] for s in starts]
    pl.concat(alone, rechunk=False).write_parquet(tmp_path / "alone.parquet", **PARQUET_OPTIONS)
    rows.rechunk().write_parquet(tmp_path / "one.parquet", **PARQUET_OPTIONS)
    assert built.read_bytes() == (tmp_path / "alone.parquet").read_bytes()
    one_buffer = (tmp_path / "one.parquet").read_bytes()
    assert (built.read_bytes() != one_buffer) is PAGES_BY_BUFFERS, pl.__version__
