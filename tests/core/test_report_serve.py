"""`rollout-shards report ROOT --serve` (pipeline/report/serve.py): the step pages and the
index over HTTP on 127.0.0.1, 404 for every other file of the root; and the `report` link
the Dagster partition records, under ROLLOUT_SHARDS_REPORT_URL or as a file URI."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.orchestration.stage_reports import OUTPUT_ENV, report_url
from pipeline.report import REPORT
from pipeline.report.serve import URL_ENV, make_server
from tests.support.cli import cli
from tests.support.report_step import SETTINGS, worked_step
from tests.support.samples import build

# No HTTP(S)_PROXY from the environment between the test and a loopback server.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A built step 5 under `out`, served on a free port; its base URL and the root."""
    out = tmp_path / "out"
    build(worked_step(tmp_path / "in"), out, **SETTINGS)
    server = make_server(out, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        yield f"http://127.0.0.1:{port}", out
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with LOOPBACK.open(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_server_answers_reports_and_the_index(served: tuple[str, Path]) -> None:
    base, out = served
    status, body = _get(f"{base}/step=5/{REPORT}")
    assert status == 200 and body == (out / "step=5" / REPORT).read_bytes()
    # the index, drawn from the manifests (nothing written), links the step's page
    for index in ("/", f"/{REPORT}"):
        status, body = _get(base + index)
        assert status == 200 and b'href="step=5/report.html"' in body, index
    assert not (out / REPORT).exists()


def test_the_server_refuses_anything_but_reports(served: tuple[str, Path]) -> None:
    base, out = served
    refused = [
        "/step=5/manifest.json",
        "/step=5/rank=0.parquet",
        "/step=5/rank=1.parquet",
        "/step=6/report.html",  # no such step
        "/step=5/../step=5/manifest.json",
        "/step=5/%2e%2e/step=5/manifest.json",
        "/../out/step=5/manifest.json",
        "/step=5/",
        "/etc/passwd",
    ]
    assert (out / "step=5" / "manifest.json").is_file()
    for path in refused:
        status, body = _get(base + path)
        assert status == 404, path
        assert b"PAR1" not in body and b'"outputs"' not in body, path


def test_the_report_link_follows_the_base_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "shards" / "dp4" / "step=7" / REPORT
    monkeypatch.setenv(OUTPUT_ENV, str(tmp_path / "shards"))
    monkeypatch.delenv(URL_ENV, raising=False)
    assert report_url(page) == page.as_uri()
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:3001/")
    assert report_url(page) == f"http://127.0.0.1:3001/dp4/step=7/{REPORT}"
    # a page outside the configured root: its step folder under the base
    assert report_url(tmp_path / "else" / "step=7" / REPORT) == (
        f"http://127.0.0.1:3001/step=7/{REPORT}"
    )


def test_an_object_store_root_is_not_served_here() -> None:
    done = cli("report", "s3://bucket/shards", "--serve")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "object store" in line and URL_ENV in line
