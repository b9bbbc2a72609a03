"""What the sensor and the schedule make of inputs that are not (yet) a clean step: a
dangling symlink named like a step, and step folders waiting for their `_SUCCESS`."""

from __future__ import annotations

import dagster as dg

from tests.support.dagster_roots import EMBEDDED_KEYS, Roots
from tests.support.dagster_sensor import requested, schedule, tick


def test_a_dangling_symlink_is_its_step_s_unreadable_file_not_a_stalled_sensor(
    instance: dg.DagsterInstance, roots: Roots
) -> None:
    (roots.input / "step=9.parquet").symlink_to(roots.input / "gone.parquet")

    first = tick(instance)
    second = tick(instance, first.cursor)

    # step 9 gets its run (which names the unreadable file); the others flow as ever
    assert requested(first) == [*EMBEDDED_KEYS, "00000009"]
    assert requested(second) == []
    assert isinstance(schedule(instance), list | dg.SkipReason)


def test_a_step_folder_without_its_marker_waits(instance: dg.DagsterInstance, roots: Roots) -> None:
    settings = roots.input / "rollout-shards.yaml"
    settings.write_text(settings.read_text() + "require_success_marker: true\n")

    waiting = tick(instance)
    (roots.input / "step=3" / "_SUCCESS").write_text("")
    complete = tick(instance, waiting.cursor)

    # step 3 is the only step given as a folder; the file steps need no marker
    assert requested(waiting) == ["00000001", "00000002", "00000004"]
    assert requested(complete) == ["00000003"]
