"""Can the tests get miles' and slime's source? `make test` asks first, in about a second.

The trainer tests run miles' and slime's own code at pinned commits (tests/support/
miles.py, slime.py): from MILES_SOURCE / SLIME_SOURCE, else from a clone
already in the user's cache, else by cloning the public repositories. Without any of these
every such test would fail on the same missing clone, after minutes of the rest; this script
says so in one line before anything is installed or run. Standard library only (it runs
before the venv exists); the URLs, pins and variable names are read from the support
modules, so they are stated once.

    python3 tests/peer_sources.py    # exit 0 silently, or one line on stderr and exit 1

(`make test` turns that line into its own error, `Makefile:<N>: *** <line>.  Stop.`)
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUPPORT = {
    "miles": HERE / "support" / "miles.py",
    "slime": HERE / "support" / "slime.py",
}
# git ls-remote of a reachable repository answers in well under a second; an address that
# drops packets would otherwise hold make for git's own minutes-long timeouts
TIMEOUT_S = 5.0


def constants(path: Path) -> dict[str, str]:
    """The module's top-level `URL`, `PIN` and `SOURCE_ENV`, read without importing it."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return {key: found[key] for key in ("URL", "PIN", "SOURCE_ENV")}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollout-shards"


def missing() -> list[dict[str, str]]:
    """The peers whose source is neither given, nor cached, nor reachable."""
    pending: list[tuple[dict[str, str], subprocess.Popen[bytes] | None]] = []
    for name, path in SUPPORT.items():
        peer = {"name": name, **constants(path)}
        given = os.environ.get(peer["SOURCE_ENV"])
        if given:
            if not Path(given).exists():
                peer["why"] = f"{peer['SOURCE_ENV']}={given} does not exist"
                pending.append((peer, None))
            continue
        if (cache_root() / f"{name}-{peer['PIN']}").is_dir():
            continue
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
        probe = subprocess.Popen(
            ["git", "ls-remote", "--exit-code", peer["URL"], "HEAD"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        pending.append((peer, probe))
    absent = []
    for peer, probe in pending:
        if probe is None:
            absent.append(peer)
            continue
        try:
            _, err = probe.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.communicate()
            peer["why"] = f"git ls-remote {peer['URL']}: no answer in {TIMEOUT_S:.0f} s"
            absent.append(peer)
            continue
        if probe.returncode:
            lines = err.decode(errors="replace").strip().splitlines()
            fatal = [line.removeprefix("fatal: ") for line in lines if line.startswith("fatal: ")]
            reason = (fatal or lines or [f"exit status {probe.returncode}"])[0]
            peer["why"] = f"git ls-remote {peer['URL']}: {reason}"
            absent.append(peer)
    return absent


def main() -> int:
    try:
        absent = missing()
    except OSError as exc:  # no git at all
        print(f"the tests need git to fetch miles and slime: {exc}", file=sys.stderr)
        return 1
    if not absent:
        return 0
    wanted = " and ".join(f"{p['SOURCE_ENV']} (a checkout of {p['URL']})" for p in absent)
    reasons = "; ".join(p["why"] for p in absent)
    print(
        f"the tests run miles' and slime's own code and cannot get it: set {wanted}, "
        f"or let git reach them ({reasons})",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
