"""The reports in a real browser (the UI test's Chromium, through playwright): every built
step's `report.html` and the root's index render with their figures, offline, and their
links lead where they say; and the same served over http by `report --serve`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.support.browser import launch, open_page
from tests.support.cli import cli
from tests.support.samples import REPO

EMPTY = {
    "staleness": "no numeric weight versions in this step",
    "quarantine": "nothing quarantined",
}
TRENDS = 7


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("reports")
    shutil.copytree(REPO / "data" / "rollouts", work / "in")
    built = cli("build", work / "in", "--out", work / "out")
    assert built.returncode == 0, built.stderr
    indexed = cli("report", work / "out")
    assert indexed.returncode == 0, indexed.stderr
    return work / "out"


def _drawn(page: Page, figure: str, marks: int = 10) -> None:
    """The figure's SVG is there and laid out with a size (the browser drew it), with more
    than `marks` marks and labels."""
    svg = page.locator(f"figure#{figure} > svg")
    expect(svg).to_have_count(1)
    box = svg.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 50, (figure, box)
    # drawn marks and labels: paths, their uses (ticks) and text
    assert svg.locator("path, use, text").count() > marks, figure


def test_every_step_report_and_the_index_render_and_link(root: Path) -> None:
    steps = sorted(int(p.name.removeprefix("step=")) for p in root.glob("step=*"))
    assert steps == [1, 2, 3, 4]
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            # no network: a page that needed one would not render its figures
            page = open_page(browser, 1200, 900, offline=True)
            failed: list[str] = []
            page.on("requestfailed", lambda request: failed.append(request.url))

            page.goto((root / "report.html").as_uri())
            expect(page.locator("h1")).to_contain_text("Steps of")
            expect(page.locator("figure > svg")).to_have_count(TRENDS)
            for name in ("rewards", "lengths", "imbalance", "quarantined"):
                _drawn(page, name)
            # the sample data has no weight versions: the figure says so
            _drawn(page, "staleness", marks=0)
            expect(page.locator("figure#staleness text")).to_have_text("no step has this value")
            links = page.locator("table a")
            expect(links).to_have_count(len(steps))
            for i, step in enumerate(steps):
                page.goto((root / "report.html").as_uri())
                page.locator("table a").nth(i).click()
                expect(page.locator("h1")).to_have_text(f"Step {step}")
                assert unquote(page.url) == unquote((root / f"step={step}/report.html").as_uri())
                for figure in ("rewards", "lengths", "ranks"):
                    _drawn(page, figure)
                for figure, note in EMPTY.items():  # nothing of them in the sample data
                    _drawn(page, figure, marks=0)
                    expect(page.locator(f"figure#{figure} text")).to_have_text(note)
                # and back to the index through the step's own link
                page.get_by_role("link", name="all steps").click()
                expect(page.locator("h1")).to_contain_text("Steps of")
            assert failed == []
            page.goto((root / "step=2" / "report.html").as_uri())
            page.screenshot(path=root.parent / "step_report.png", full_page=True)
            assert (root.parent / "step_report.png").stat().st_size > 0
        finally:
            browser.close()


# A dense miles shape: the step pages draw FLOPs per rank too.
SHAPE = ["--num-layers", "4", "--hidden-size", "256", "--ffn-hidden-size", "1024"]
SHAPE += ["--num-attention-heads", "8", "--vocab-size", "32000"]


def test_served_reports_open_by_clicks_and_draw_flops_with_a_shape(tmp_path: Path) -> None:
    """`rollout-shards report ROOT --serve`, as `make ui` starts it: its one line names the
    URL; from the index at `/`, each step's link opens its page over http, FLOPs per rank
    drawn (built with the model's shape), and its link back leads to the index."""
    shutil.copytree(REPO / "data" / "rollouts", tmp_path / "in")
    out = tmp_path / "out"
    built = cli("build", tmp_path / "in", "--out", out, *SHAPE)
    assert built.returncode == 0, built.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "report", str(out), "--serve", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert served.stdout is not None
        line = served.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        assert (
            line
            == f"rollout-shards: report: serving the reports of {out} at {base}/ (Ctrl-C stops)\n"
        )
        with sync_playwright() as playwright:
            browser = launch(playwright)
            try:
                page = open_page(browser, 1200, 900)
                for step in (1, 2, 3, 4):
                    page.goto(f"{base}/")
                    expect(page.locator("h1")).to_contain_text("Steps of")
                    page.get_by_role("link", name=f"step {step}", exact=True).click()
                    expect(page.locator("h1")).to_have_text(f"Step {step}")
                    assert page.url == f"{base}/step={step}/report.html"
                    for figure in ("rewards", "lengths", "ranks", "flops"):
                        _drawn(page, figure)
                    expect(page.locator("th", has_text="flops")).to_have_count(1)
                    page.get_by_role("link", name="all steps").click()
                    expect(page.locator("h1")).to_contain_text("Steps of")
                    assert page.url == f"{base}/report.html"
                page.goto(f"{base}/step=2/report.html")
                page.screenshot(path=tmp_path / "served_step.png", full_page=True)
                # a shard is not served
                answer = page.goto(f"{base}/step=2/rank=0.parquet")
                assert answer is not None and answer.status == 404
            finally:
                browser.close()
    finally:
        served.terminate()
        served.wait(timeout=30)
    assert not (out / "report.html").exists()  # the index was drawn per request, not written
