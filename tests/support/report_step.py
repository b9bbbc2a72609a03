"""A small worked step for the report's tests: its figures' numbers are known by hand."""

from __future__ import annotations

from pathlib import Path

from tests.support.samples import sample as row
from tests.support.samples import write_step


def worked_step(folder: Path) -> Path:
    """Step 5: three prompt groups of 4 (group 1's samples share one reward), two
    truncated samples, weight versions 3 and 4 behind, and one row quarantined."""
    rows = []
    for i in range(12):
        group = i // 4
        reward = 1.0 if group == 1 else float(i % 2)
        rows.append(
            row(
                i,
                step=5,
                group_index=group,
                reward=reward,
                response_length=2 + i,
                status="truncated" if i in (3, 7) else "completed",
                weight_versions=["2"] if i < 6 else ["1", "x"],
            )
        )
    # a response longer than its tokens: quarantined by response_within_tokens
    rows.append(
        row(12, step=5, group_index=3, tokens=[1, 2], weight_versions=["2"])
        | {"response_length": 9}
    )
    write_step(folder, rows, step=5)
    return folder


SETTINGS = {"global_batch_size": 4, "dp_size": 2, "on_invalid": "quarantine"}
