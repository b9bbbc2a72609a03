"""verl's own dumps as input (pipeline/io/formats/verl.py): the DataProto verl 0.9.1's agent
loop returns for a step, written by its `save_to_disk` where the rollout skip manager keeps
it (`<dump folder>/<step>/gen_batch.dp` and `meta.json`), read without running code and
built with `--trainer verl`, gives every rank the chunk verl's trainer hands it; a pickle
asking for anything else is refused before anything of it runs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rollout_shards_loader.verl import read_rank

from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.formats.verl import read_verl_dump
from tests.support.samples import build
from tests.support.verl import DUMP_SETTINGS as SETTINGS
from tests.support.verl import assert_same, dump_rows, trainer_ranks, write_dump


@pytest.mark.parametrize(("uid", "log_probs"), [(True, True), (False, False)])
def test_a_verl_dump_builds_verls_own_ranks(tmp_path: Path, uid: bool, log_probs: bool) -> None:
    rows = dump_rows(log_probs)
    dumps = write_dump(tmp_path / "dump", rows, 5, uid)
    frame = read_verl_dump(dumps / "5" / "gen_batch.dp", 5)
    assert frame.get_column("group_index").to_list() == [r["group_index"] for r in rows]
    assert frame.get_column("tokens").to_list() == [r["tokens"] for r in rows]
    assert frame.get_column("reward").to_list() == [r["reward"] for r in rows]
    assert ("rollout_log_probs" in frame.columns) == log_probs
    manifest = build(dumps, tmp_path / "out", **SETTINGS)
    assert manifest["counts"]["written"] == 12
    want = trainer_ranks(rows, SETTINGS)
    for rank in range(2):
        assert_same(read_rank(tmp_path / "out" / "step=5", rank), want[rank])


def test_a_step_folder_without_meta_is_not_read_yet(tmp_path: Path) -> None:
    dumps = write_dump(tmp_path / "dump", dump_rows(), 2, True)
    (dumps / "2" / "meta.json").unlink()
    notes: list[str] = []
    assert find_sources([dumps], notes=notes) == []
    assert notes == [f"skipped {dumps / '2'}: no meta.json yet (verl writes it after the batch)"]


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_dump_asking_for_code_is_refused(tmp_path: Path) -> None:
    rows = dump_rows()
    path = write_dump(tmp_path / "dump", rows, 3, True) / "3" / "gen_batch.dp"
    gen = pickle.loads(path.read_bytes())
    gen.non_tensor_batch["extras"] = np.array([_Boom()] * len(rows), dtype=object)
    path.write_bytes(pickle.dumps(gen))
    with pytest.raises(StepError) as caught:
        read_verl_dump(path, 3)
    (violation,) = caught.value.violations
    assert violation.rule == "unsafe_pickle" and "posix.system" in violation.message
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
