"""Stand-in Pipes workers for the subprocess session's tests (run as a script).

stand_in_worker.py streaming  report rollout_samples, then wait (up to 60 s) until Dagster
                              has stored that materialization before reporting the rest
stand_in_worker.py hang PATH  write this process's pid to PATH, then sleep until stopped
"""

from __future__ import annotations

import os
import sys
import time

import dagster as dg
from dagster_pipes import open_dagster_pipes


def streaming() -> None:
    with open_dagster_pipes() as pipes:
        pipes.report_asset_materialization(asset_key="rollout_samples", metadata={"rows": 16})
        instance = dg.DagsterInstance.get()  # the test's instance: $DAGSTER_HOME
        waited = time.monotonic()
        stored: list[str] = []
        while not stored and time.monotonic() - waited < 60:
            records = instance.get_records_for_run(
                pipes.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            ).records
            stored = [
                r.event_log_entry.dagster_event.event_specific_data.materialization.asset_key.to_user_string()  # type: ignore[union-attr]
                for r in records
            ]
            time.sleep(0.02)
        pipes.log.info(f"stored while the worker ran: {stored}")
        for asset in ("train_batch", "training_shards"):
            pipes.report_asset_materialization(asset_key=asset, metadata={"rows": 16})


def hang(pid_file: str) -> None:
    with open_dagster_pipes():
        with open(pid_file + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        while True:
            time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "streaming":
        streaming()
    else:
        hang(sys.argv[2])
