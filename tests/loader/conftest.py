"""The loader is its own distribution (loader/); in-process tests import it from source."""

from __future__ import annotations

import sys
from pathlib import Path

LOADER = Path(__file__).resolve().parents[2] / "loader"
if str(LOADER) not in sys.path:
    sys.path.insert(0, str(LOADER))
