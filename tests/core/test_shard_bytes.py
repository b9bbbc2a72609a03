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
# change on purpose (SEMANTICS 6.1's train_step; step, rank and every optional column; last:
# miles' two sampling-mask columns, null in these steps, the rest of each file unchanged).
BEFORE_2 = {
    "compact-strided": [
        "d9935af4c7b813536879e022421ee0d85c679dd7aeaa1e2f949046faa5309c45",
        "c6d5b764b202bb915ee484f1d5f7f96b6cf7acc75c34bfde570a22a6a3145de8",
        "1e57a8991e7121ea415b0b8fb9c0b339f0acfa85ac817ddc51222af0f9ad6012",
        "dfa4899d64ff1ae39089d3a47c75feca6fc13879e3db41bea77f27d7ba7cb4b5",
    ],
    "compact-balanced": [
        "5148295048315591f270cf4ed61c110a783b3960730feabaf612b9e687d5eb70",
        "d3e0f183a23f59ef8d165315ffb0b26c89da00191988b4c093cd9617ab0cade6",
        "d84b6d82573886af08e8de517dccc973cf8cba693f3ada6e0509c3aa09d71f55",
        "68dbc0d90e0ed2b69cc711a8dcbb0cef8498a91589c24ec4ab9ecbc4b4c21391",
    ],
    "non-compact-strided": [
        "74a247922a968d909e55a8327b1d7528e0f4b3634afaed2c121c10bab77e7862",
        "d96e4ad27c4a8e777868285a9df7ac349b2507893945de90f1555208b32aa9fe",
        "23d270a46f48c959f35ce1a1f710a5d87cd7400b08dd4807fcb64f1fd5e8785d",
        "ebcab6ab7846d5fd16a13fc99a4698314354b49238644b9148279e71980c2468",
    ],
    "non-compact-balanced": [
        "a887df8bb6390d1017d15fb1e58148c30f7f1c5bee061d88cf78b03485f51405",
        "68851cea252d635412fee874728447ff9517aa479dd6d9475dcf26c1cfb9bc32",
        "140a4397b531dba39b2074e736a91608fada0b2aa81f43aa2bcba0b012e21645",
        "d2be7e07e526327629d7fc02bcb2236c8bbe29312b7026894ec9a13bafc4787f",
    ],
}


# The same files as Polars 1.42 writes them.
BEFORE_1 = {
    "compact-strided": [
        "bebe1a3e0c1859b607da20ac88f80ea5246e0a5c0c1f7dffedc91735143541b6",
        "f103cb3191b0aa70c5b98bd12aef0f43dbd31020c2d8e021f1de0e7316a4eb0f",
        "86da797aa912409da9fcdbf4e624ae2068a08bb033d1d28201913f08eeb30d73",
        "0d31d204ee30ee5dfe3b6f33cf48ac778eb0a473ea4cdd9c72d3c27681da04d1",
    ],
    "compact-balanced": [
        "5aca117cc99a63a82346cf8037d1a0c935e5b29e346b69ee09b1f468b7496df5",
        "1ba3580374c4a4bc8e36d0efe89b5975c3afea325320dc634e3dcd99ad8d2c9d",
        "b8e5354f703430f131e28020f9362b88f0c1d208f7f6e1ba4f22a42648b7bc55",
        "4d99bd98411094fb57994c671ac105da051857e9f524e24a70785e6073f118a8",
    ],
    "non-compact-strided": [
        "7b696398b9ae3928a141a36ddc9a9c24652811fccdb613897038653e93292af6",
        "9ed03bb8eade8c4142a8542f448d591e30475d946c690ab3b7923416a2a67aac",
        "e05034274bbb0074b7a0ef28a8b9defe844a6dc9f7b4ea5f86791ae9a9499e0a",
        "34e038d78733617bbbb35c669706dbb1ad84d02f8e7d96fb6af012af65cc5293",
    ],
    "non-compact-balanced": [
        "3cd7dc6298751db42d2a3eabb322a9a495ddd0088e57b3c48cd38ba6499f4a5f",
        "a57440165f91279718d2a0801fc8faf95371a149edc232898ef72012c656dfa9",
        "cae1fcf61c3d51de04c78f9ba410882d048d5219c17533ae7b48302bd0b45be9",
        "4aaa50c184c2e127a0c408d11448f5165989ae98020c4c5facf7b7d40bba5a7f",
    ],
}
BEFORE = {"1": BEFORE_1, "2": BEFORE_2}
# `decoded_digest` of those rank files, the same under Polars 1.42 and 2.x.
DECODED = {
    "compact-strided": [
        "2317c739dafee1679359892f5e7fcb77a973bfa1ad598dffc6fa0ee91bee40ad",
        "d8bf57fb1fbbc390a16558b27fec72c8fb1c80728799e0e885df457194970842",
        "15c6303aff4876772709bf19fad0b088443fd34d678e6ead20b6992d6923f3b4",
        "5a2fa68302915c7174cef96211917e438f6680c59bd4036ab18128bc3770277b",
    ],
    "compact-balanced": [
        "02fe433be3e3c75b322155e6c1a7a7f2c916b1cfd9b17bea04de0fd002613f65",
        "9488e0b313b18e13c8356250f09cf03a834fa970b2315fd692799a631f2022be",
        "a33c4cdb6d8eea29f1300a37966176f8d91a8e81da7bd576ba512d083a6250fb",
        "a82ed1e3cdfbdf9a235e5fa511b7bfd15688662ca2d406a52ab9dcde449002f6",
    ],
    "non-compact-strided": [
        "d3257414339d072c0c7051f45b2c30dea4bb66c9859cf1eee9eb673ffe92a798",
        "a1a18af49cddc695d4e94156436f08ab74d9a95afa3828fcda0bab0309a1f16f",
        "dc8d89c1ff7031160656fd3cd305cb413f05015080d8d9b5f071b16d0830d53e",
        "19114220a824b9c601fbcb67a1b564850a5e110d16dad4560fe357aa713afe88",
    ],
    "non-compact-balanced": [
        "82ba8951ab2898d9850b4d697ea503335ba0e51670030af58e9f274636e9e2aa",
        "35f4674365f402edcb462f3106ccbae277feaf43508a652a6ce66a27ec7ed88e",
        "7c739637fd71824bb6a0e534af2842b91eaa77a94f761c766d1b90e2ca4fdcf2",
        "50c4aed7067c962df506205823910b8abba289e60f3d77fd8eccb383ed73ff96",
    ],
}
# `decoded_digest` of the rank files of data/rollouts' steps 1-4 with its settings.
SAMPLE_DECODED = {
    "sample-1": [
        "31847d2a7068e30bf5b74efbc525f05f9f4c573f22a04191c91c40e039723b30",
        "fee1659cfab0ae6b82677c680ade40854f5a4b1189b6dbe3a051d6646f818998",
    ],
    "sample-2": [
        "2846975df742fa8afd1229b8d25841d9fe5888eb388dc35a19941e2d99f39289",
        "d4401ab8c4091ef0e4606ba33d713f1ac224461db8db98e86e78eef7216686e6",
    ],
    "sample-3": [
        "1cfe55a9a43421809b937fa04b8edd0f1841993c3e99998051c4ee3763a522ac",
        "d7671226add2e53625bc212b5f55cc207b3be26cb888e1d09c3b5951815d40cb",
    ],
    "sample-4": [
        "ece03d1cffe8166369ae863114eaafc17b833f42e68f5cee14a0919367125137",
        "da45f29569d05fb46d2e94c6c58ad0b0687cb6eacb5b87ee6f7fa526d0db5321",
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
        assert [o.sha256 for o in ranks] == BEFORE[POLARS_MAJOR][f"{kind}-{name}"]
        folder = tmp_path / name / "step=0"
        assert [decoded_digest(folder / o.path) for o in ranks] == DECODED[f"{kind}-{name}"], name


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
