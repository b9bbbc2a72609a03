"""The browser the UI and report tests drive (through playwright): Debian's Chromium, or
the one `make test CHROMIUM=...` names, headless and offline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

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


def launch(playwright: Any) -> Any:
    """The Chromium the tests drive, headless (`make browser` installs Debian's)."""
    assert Path(CHROMIUM).is_file(), (
        f"{CHROMIUM} is missing: `make browser` installs Debian's chromium, or name another "
        "with ROLLOUT_SHARDS_CHROMIUM"
    )
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def open_page(browser: Any, width: int, height: int, offline: bool = False) -> Page:
    """A page of its own context (`offline`: no network at all), with the tests' waits: a
    page's and `expect`'s own (5 s) are too short for a loaded CI machine."""
    context = browser.new_context(offline=offline, viewport={"width": width, "height": height})
    page: Page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    expect.set_options(timeout=PAGE_TIMEOUT_MS)
    return page
