"""A read-only web server of an output root's reports, so the Dagster UI's `report` link
opens on a click (a browser will not follow a `file:` link from an `http:` page).

It answers GET and HEAD for a step's page, `[<folder>/]step=<N>/report.html`, and for the
index, `/` or `[<folder>/]report.html`, which it draws from the committed manifests on each
request, so it lists the steps built since it started and writes nothing. Anything else (a
rank file, a manifest, the staging folder, a path that leaves the root) is 404. It binds
127.0.0.1 unless told otherwise. A local root only: an object store's reports are served
by the store's own https or website endpoint (docs/report.md).
"""

from __future__ import annotations

import http.server
import re
import sys
from functools import partial
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pipeline.errors import PROG, StepError, UsageError
from pipeline.report import REPORT

HOST = "127.0.0.1"
PORT = 3001
URL_ENV = "ROLLOUT_SHARDS_REPORT_URL"

# Sub-folders of the root (a Dagster run's `output_root`), never `.`, `..` or hidden ones.
_FOLDERS = r"((?:[A-Za-z0-9_-][A-Za-z0-9_.=-]*/)*)"
_STEP_PAGE = re.compile(rf"/{_FOLDERS}step=\d+/{re.escape(REPORT)}")
_INDEX = re.compile(rf"/{_FOLDERS}(?:{re.escape(REPORT)})?")


class ReportHandler(http.server.BaseHTTPRequestHandler):
    """Serves `root`'s report pages and its index; 404 for everything else."""

    server_version = "rollout-shards-report"

    def __init__(self, *args: object, root: Path, **kwargs: object) -> None:
        self.root = root
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the server's one line is the URL it serves at."""

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        page, status = self._page(path)
        data = page.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _page(self, path: str) -> tuple[str, int]:
        if _STEP_PAGE.fullmatch(path):
            file = self._inside(path)
            if file is not None and file.is_file():
                return file.read_text(encoding="utf-8", errors="replace"), 200
        elif (found := _INDEX.fullmatch(path)) is not None:
            folder = self._inside("/" + found.group(1))
            if folder is not None and folder.is_dir():
                return _index(folder)
            if folder == self.root:  # `make ui` serves the root before a step is built
                return _not_found(f"nothing built under {self.root} yet"), 404
        return _not_found(f"{path}: not a report of {self.root}"), 404

    def _inside(self, path: str) -> Path | None:
        """The file `path` names under the root, None where a link would take it out."""
        target = (self.root / path.lstrip("/")).resolve()
        return target if target.is_relative_to(self.root) else None


def _index(folder: Path) -> tuple[str, int]:
    from pipeline.report.index import committed, index_page

    try:
        manifests = committed(folder)
        return index_page(folder, folder / REPORT, manifests), 200
    except StepError as exc:  # no committed step yet
        return _not_found(str(exc)), 404


def _not_found(why: str) -> str:
    from html import escape

    return f"<!DOCTYPE html><title>not found</title><p>{escape(why)}</p>\n"


def make_server(root: Path, host: str = HOST, port: int = PORT) -> http.server.HTTPServer:
    """A server of `root`'s reports on `host`:`port` (0: a free port), not yet serving."""
    if root.exists() and not root.is_dir():  # a root not made yet is served once built
        raise UsageError(f"report --serve: {root} is not a folder: give an output root of build")
    handler = partial(ReportHandler, root=root.resolve())
    return http.server.ThreadingHTTPServer((host, port), handler)


def serve(root: Path, host: str = HOST, port: int = PORT) -> None:
    """Serve `root`'s reports until interrupted; one line says where."""
    server = make_server(root, host, port)
    address = f"http://{host}:{server.server_address[1]}"
    print(f"{PROG}: report: serving the reports of {root} at {address}/ (Ctrl-C stops)")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
