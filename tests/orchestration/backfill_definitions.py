"""The project's definitions under the multiprocess executor, for test_backfill.py.

`dagster job execute -f tests/orchestration/backfill_definitions.py` loads them in each
run's process,
and the executor starts every step (asset or check) of the run in a process of its own,
as a deployment whose runs use the multiprocess executor would.
"""

import dagster as dg

from pipeline import definitions

defs = dg.Definitions(
    assets=definitions.defs.assets,
    asset_checks=definitions.defs.asset_checks,
    jobs=definitions.defs.jobs,
    resources=definitions.defs.resources,
    executor=dg.multiprocess_executor,
)
