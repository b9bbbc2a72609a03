"""A/B of pydantic on the settings' fast path: a process that makes well-typed settings
(as flags, YAML and run config give them) with the exact-type check alone (A, the
default), or with every value read by pydantic (B), each in a fresh interpreter,
interleaved; prints the medians of the time from the first import to the settings made.

    python -m bench.settings_pydantic_ab [rounds]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

VALUES = {"trainer": "miles", "global_batch_size": 8, "dp_size": 2, "balance_data": True}
SCRIPT = """
import time, json, sys
start = time.perf_counter()
import pipeline.settings as s
if {force}:
    s._exact = lambda kind, value: False  # every value through pydantic
s.make_settings({values})
print(json.dumps([time.perf_counter() - start, "pydantic" in sys.modules]))
"""


def _one(force: bool) -> tuple[float, bool]:
    code = SCRIPT.format(force=force, values=VALUES)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, loaded = json.loads(out.stdout)
    return seconds, loaded


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    times: dict[bool, list[float]] = {False: [], True: []}
    loaded: dict[bool, bool] = {}
    for _ in range(rounds):
        for force in (False, True):
            seconds, loaded[force] = _one(force)
            times[force].append(seconds)
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(
        json.dumps(
            {
                "rounds": rounds,
                "exact_types_s": round(a, 4),
                "pydantic_s": round(b, 4),
                "pydantic_over_exact": round(b / a, 2),
                "pydantic_loaded": {"exact_types": loaded[False], "pydantic": loaded[True]},
            }
        )
    )


if __name__ == "__main__":
    main()
