"""The core knows no Dagster: the CLI and every core module import without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pipeline"
# Everything that imports Dagster lives here; the rest of `pipeline` is the core.
ORCHESTRATION = ("definitions.py", "assets", "orchestration")


def core_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ORCHESTRATION:
            continue
        parts = ("pipeline", *relative.with_suffix("").parts)
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_the_core_is_every_module_outside_the_orchestration_layer() -> None:
    modules = core_modules()
    assert "pipeline.cli" in modules
    assert "pipeline.step.stages" in modules
    assert not any("orchestration" in name or "assets" in name for name in modules)


def test_cli_and_core_import_without_dagster() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0].startswith('dagster'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def test_the_orchestration_layer_is_what_imports_dagster() -> None:
    """No core module names Dagster at all, so no arrow runs back up."""
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in ORCHESTRATION
        and ("import dagster" in path.read_text() or "from dagster" in path.read_text())
    ]
    assert offenders == []
