"""The browser the UI and report tests drive (through playwright): Debian's Chromium, or
the one `make test CHROMIUM=...` names, headless and offline."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("ROLLOUT_SHARDS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Bounded waits, generous for a loaded 2-core CI machine; nothing asserts on durations.
PAGE_TIMEOUT_MS = 60_000
