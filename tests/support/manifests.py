"""A small manifest of known fields, for the tests of the manifest's own reading and writing
(imported by a subprocess too: nothing here may load pydantic)."""

from __future__ import annotations

from pipeline.manifest import Counts, InputFile, Manifest, OutputFile


def manifest() -> Manifest:
    return Manifest(
        step=3,
        settings={"global_batch_size": 4, "dp_size": 2},
        inputs=[InputFile(path="in/step=3.parquet", sha256="ab" * 32, rows=5)],
        counts=Counts(ingested=5, quarantined=0, repaired=0, trimmed=1, dropped=0, written=4),
        repaired={"cleared": 0, "stamped": 0},
        is_compact=False,
        global_batch_size=4,
        dynamic_global_batch_size=None,
        num_train_steps=1,
        num_rollouts=[4],
        num_microbatches=None,
        equal_reward_groups=0,
        ignored_columns=[],
        stats={"rollout/raw_reward": 0.5, "untrained_ratio": 0.0},
        outputs=[OutputFile(path="rank=0.parquet", sha256="cd" * 32, rows=2, tokens=40)],
        dropped_raw_reward=[None, 1.5],
    )
