"""A step's report (pipeline/report): the numbers of its figures from a small worked step,
the page committed with the step (listed, checksummed, verified by the loader, ignored by
the dataset readers, the same bytes on a rebuild), drawn without any figure library, and
`rollout-shards report ROOT`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.io.checksums import sha256_of
from pipeline.report import REPORT, data
from pipeline.report.embed import figures_markdown
from pipeline.step.tables import TrainBatch
from tests.support.cli import cli, digests
from tests.support.report_step import SETTINGS, worked_step
from tests.support.samples import REPO, build, plan, write_step
from tests.support.samples import sample as row

FIGURES = ("rewards", "lengths", "ranks", "staleness", "quarantine")


def test_the_figures_numbers_of_a_worked_step(tmp_path: Path) -> None:
    batch = plan(worked_step(tmp_path / "in"), **SETTINGS)
    rows = batch.report_rows()
    numbers = data.step_figures(rows, batch.meta, batch.quarantine)
    # every trained prompt group, in order: its mean raw reward, size, one reward or not
    assert numbers.groups.to_dicts() == [
        {data.GROUP_MEAN: 0.5, data.GROUP_SIZE: 4, data.ONE_REWARD: False},
        {data.GROUP_MEAN: 1.0, data.GROUP_SIZE: 4, data.ONE_REWARD: True},
        {data.GROUP_MEAN: 0.5, data.GROUP_SIZE: 4, data.ONE_REWARD: False},
    ]
    assert sorted(numbers.lengths.get_column(c.RESPONSE_LENGTHS).to_list()) == list(range(2, 14))
    assert numbers.lengths.get_column(c.TRUNCATED).sum() == 2
    # tokens per rank: 2 prompt tokens + response, the ranks' rows as the plan dealt them
    per_rank = rows.group_by(c.RANK).agg(pl.col(c.TOTAL_LENGTHS).sum()).sort(c.RANK)
    assert (
        numbers.ranks.get_column(data.TOKENS).to_list()
        == per_rank.get_column(c.TOTAL_LENGTHS).to_list()
    )
    assert numbers.ranks.get_column(data.TOKENS).sum() == sum(4 + i for i in range(12))
    assert numbers.ranks.get_column(data.ROWS).to_list() == [6, 6]
    # step 5 less the oldest numeric version: 6 rows of version 2, 6 of version 1
    assert numbers.staleness.to_dicts() == [
        {data.STALENESS: 3, data.ROWS: 6},
        {data.STALENESS: 4, data.ROWS: 6},
    ]
    assert numbers.rules.to_dicts() == [{"rule": "response_within_tokens", data.ROWS: 1}]
    assert numbers.quarantined.get_column(c.INDEX).to_list() == [12]
    assert numbers.quarantined.get_column(c.REASON).str.contains("response_within_tokens").all()


def test_a_rank_without_rows_and_rows_without_groups() -> None:
    rows = pl.DataFrame(
        {
            c.RANK: [0, 0, 2],
            c.TOTAL_LENGTHS: [5, 7, 11],
            c.RAW_REWARD: [None, 1.0, 1.0],
            c.REWARDS: [2.0, 0.0, 0.0],
            c.REPORT_GROUP: [None, None, None],
        },
        schema_overrides={c.RANK: pl.Int32, c.REPORT_GROUP: pl.Int64},
    )
    assert data.rank_load(rows.lazy(), 4).collect().rows() == [
        (0, 2, 12),
        (1, 0, 0),
        (2, 1, 11),
        (3, 0, 0),
    ]
    # no group_index: one group, its raw rewards 2.0 (none given: the reward), 1.0, 1.0
    assert data.group_rewards(rows.lazy()).collect().rows() == [(4.0 / 3.0, 3, False)]


# A miles MoE shape, balanced by FLOPs (tests/trainers/miles/test_flops_shapes.py's kind).
MOE = {
    "num_layers": 4,
    "hidden_size": 256,
    "ffn_hidden_size": 1024,
    "num_attention_heads": 8,
    "num_query_groups": 2,
    "vocab_size": 32000,
    "num_experts": 8,
    "moe_ffn_hidden_size": 128,
    "moe_layer_freq": [0, 1, 1, 1],
    "use_dynamic_batch_size": True,
    "balance_by_flops": True,
    "cp_size": 1,
    "max_tokens_per_gpu": 40,
}


def test_flops_per_rank_are_the_planners_for_the_built_layout(tmp_path: Path) -> None:
    from pipeline import planner
    from pipeline.settings import load_settings

    source = worked_step(tmp_path / "in")
    settings = {**SETTINGS, **MOE}
    batch = plan(source, **settings)
    numbers = data.step_figures(batch.report_rows(), batch.meta, batch.quarantine)
    planned = planner.rank_figures(batch, load_settings(**settings))
    assert numbers.has_flops
    assert numbers.ranks.get_column(data.FLOPS).to_list() == (
        planned.get_column(planner.FLOPS).to_list()
    )
    assert all(flops > 0 for flops in planned.get_column(planner.FLOPS).to_list())
    # the page built with the shape draws them, and its table has a flops column
    build(source, tmp_path / "out", **settings)
    text = (tmp_path / "out" / "step=5" / REPORT).read_text()
    assert re.search('<figure id="flops"><svg', text)
    assert "<th>flops</th>" in text and "need the model" not in text


def test_without_a_shape_the_page_says_what_flops_need(tmp_path: Path) -> None:
    batch = plan(worked_step(tmp_path / "in"), **SETTINGS)
    numbers = data.step_figures(batch.report_rows(), batch.meta, batch.quarantine)
    assert not numbers.has_flops and numbers.ranks.columns == [c.RANK, data.ROWS, data.TOKENS]
    build(worked_step(tmp_path / "in2"), tmp_path / "out", **SETTINGS)
    text = (tmp_path / "out" / "step=5" / REPORT).read_text()
    assert 'id="flops"' not in text and "<th>flops</th>" not in text
    assert "FLOPs per rank need the model's shape" in text


def test_the_report_is_committed_with_the_step(tmp_path: Path) -> None:
    manifest = build(worked_step(tmp_path / "in"), tmp_path / "out", **SETTINGS)
    folder = tmp_path / "out" / "step=5"
    page = folder / REPORT
    assert manifest["report"] == REPORT
    (record,) = [o for o in manifest["outputs"] if o["path"] == REPORT]
    assert record == {
        "path": REPORT,
        "sha256": sha256_of(page),
        "rows": 0,
        "tokens": None,
        "raw_reward_sha256": None,
    }
    text = page.read_text()
    # self-contained: no script, nothing loaded from elsewhere
    assert "<script" not in text and not re.search(r'(src|href)="(https?:)?//', text)
    for name in FIGURES:
        assert re.search(f'<figure id="{name}"><svg', text), name
    # the loader verifies it: tests/loader/test_report_verify.py
    # the dataset readers see only rank files
    dataset = pl.scan_parquet(tmp_path / "out" / "step=*" / "rank=*.parquet").collect()
    assert dataset.height == 12
    # the partition's Markdown carries three of the figures inline
    markdown = figures_markdown(page)
    assert markdown.count("](data:image/svg+xml;base64,") == 3
    assert str(page) in markdown


def test_a_rebuild_writes_the_same_report_and_a_current_step_is_kept(tmp_path: Path) -> None:
    source = worked_step(tmp_path / "in")
    flags = ["--global-batch-size", "4", "--dp-size", "2", "--on-invalid", "quarantine"]
    first = cli("build", source, "--out", tmp_path / "a", *flags)
    assert first.returncode == 0, first.stderr
    again = cli("build", source, "--out", tmp_path / "a", *flags)
    assert "up to date" in again.stdout, again.stdout
    other = cli("build", source, "--out", tmp_path / "b", "--force", *flags)
    assert other.returncode == 0, other.stderr
    a, b = digests(tmp_path / "a"), digests(tmp_path / "b")
    assert a["step=5/report.html"] == b["step=5/report.html"]
    assert a["step=5/manifest.json"] == b["step=5/manifest.json"]


def test_a_staged_batch_keeps_the_report_columns(tmp_path: Path) -> None:
    batch = plan(worked_step(tmp_path / "in"), **SETTINGS)
    want = batch.report_rows()
    staged = batch.staged_frame()
    assert set(c.REPORT_COLUMNS) <= set(staged.columns)
    again = TrainBatch(batch.step, staged, batch.meta, batch.quarantine)
    assert not set(c.REPORT_COLUMNS) & set(again.frame.columns)
    assert again.report_rows().equals(want)


# No figure library can be imported: the report's figures are the project's own SVG.
NO_FIGURE_LIBRARY = (
    "import sys\n"
    "for name in ('leather', 'matplotlib', 'plotly', 'altair', 'pygal'):\n"
    "    sys.modules[name] = None\n"
)


def test_every_build_writes_its_report_without_a_figure_library(tmp_path: Path) -> None:
    source = worked_step(tmp_path / "in")
    write_step(source, [row(i, step=6, group_index=i // 4) for i in range(8)], step=6)
    code = NO_FIGURE_LIBRARY + "from pipeline import cli; sys.exit(cli.main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "build", str(source), "--out", str(tmp_path / "out")]
        + ["--global-batch-size", "4", "--dp-size", "2", "--on-invalid", "quarantine"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert REPORT not in done.stderr, done.stderr
    for step in (5, 6):
        folder = tmp_path / "out" / f"step={step}"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["report"] == REPORT
        assert REPORT in {o["path"] for o in manifest["outputs"]}
        for name in FIGURES:
            assert re.search(f'<figure id="{name}"><svg', (folder / REPORT).read_text()), name


def test_the_index_links_every_step(tmp_path: Path) -> None:
    source = worked_step(tmp_path / "in")
    write_step(source, [row(i, step=6, group_index=i // 4) for i in range(8)], step=6)
    out = tmp_path / "out"
    flags = ["--global-batch-size", "4", "--dp-size", "2", "--on-invalid", "quarantine"]
    assert cli("build", source, "--out", out, *flags).returncode == 0
    done = cli("report", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"rollout-shards: report: {out / REPORT}\n"
    text = (out / REPORT).read_text()
    assert re.findall(r'<a href="([^"]+)"', text) == ["step=5/report.html", "step=6/report.html"]
    assert text.count("<svg") == 7
    elsewhere = tmp_path / "pages" / "index.html"
    elsewhere.parent.mkdir()
    assert cli("report", out, "--out", elsewhere).returncode == 0
    assert re.findall(r'<a href="([^"]+)"', elsewhere.read_text())[0] == "../out/step=5/report.html"


def test_the_index_of_no_root_is_one_line(tmp_path: Path) -> None:
    for root in (tmp_path / "missing", tmp_path):
        done = cli("report", root)
        assert done.returncode == 1
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("rollout-shards: report: "), done.stderr


def _reward_bins(groups: pl.DataFrame) -> data.Histogram:
    return data.histogram_of(groups, data.GROUP_MEAN, data.ONE_REWARD, data.REWARD_BINS)


def test_a_group_without_a_finite_mean_reward_is_counted_but_not_binned() -> None:
    from pipeline.report import figures

    groups = pl.DataFrame(
        {
            data.GROUP_MEAN: [float("nan"), None, 0.25, 0.75],
            data.GROUP_SIZE: [2, 2, 2, 2],
            data.ONE_REWARD: [True, None, False, True],
        }
    )
    binned = _reward_bins(groups)
    svg = figures.group_rewards(binned)
    assert "2 of 4 prompt groups have one reward" in svg
    assert sum(binned.total) == 2 and sum(binned.marked) == 1
    assert len(binned.total) == data.REWARD_BINS
    assert binned.total[0] == binned.total[-1] == 1 and binned.marked[-1] == 1
    assert figures.bin_labels(binned.starts)[:2] == ["0.25", "0.275"]
    no_bins = figures.group_rewards(_reward_bins(groups.head(2)))
    assert "no prompt group has a finite mean reward" in no_bins


def test_a_value_on_a_bin_edge_is_in_the_bin_it_starts() -> None:
    """0.75 of 0..3 in 20 bins is the start of bin 5, where the eager code put it: with the
    range's ends and width computed as expressions of the binning query, it went to bin 4."""
    groups = pl.DataFrame(
        {data.GROUP_MEAN: [0.0, 0.75, 0.8, 3.0, float("nan")], data.ONE_REWARD: [False] * 5}
    )
    binned = _reward_bins(groups)
    assert [i for i, total in enumerate(binned.total) if total] == [0, 5, 19]
    assert binned.total[5] == 2 and binned.rows == 5


def test_the_histograms_of_a_worked_step(tmp_path: Path) -> None:
    batch = plan(worked_step(tmp_path / "in"), **SETTINGS)
    numbers = data.step_figures(batch.report_rows(), batch.meta, batch.quarantine)
    # mean rewards 0.5, 1.0 (one reward), 0.5: 20 bins from 0.5 to 1.0
    rewards = numbers.reward_bins
    assert (rewards.rows, rewards.marked_rows) == (3, 1)
    assert rewards.starts == [0.5 + i * 0.025 for i in range(20)]
    assert rewards.total == [2] + [0] * 18 + [1] and rewards.marked == [0] * 19 + [1]
    # response lengths 2..13, the samples 3 and 7 (lengths 5 and 9) truncated
    lengths = numbers.length_bins
    assert (lengths.rows, lengths.marked_rows) == (12, 2)
    assert [i for i, total in enumerate(lengths.total) if total] == [
        *range(0, 12, 2),
        *range(13, 24, 2),
    ]
    assert sum(lengths.total) == 12 and [i for i, n in enumerate(lengths.marked) if n] == [6, 15]


def test_a_figure_is_the_same_bytes_for_the_same_numbers() -> None:
    from pipeline.report import figures

    ranks = pl.DataFrame(
        {c.RANK: [0, 1, 2], data.ROWS: [3, 3, 2], data.TOKENS: [1234567, 1000001, 999]}
    )
    drawn = figures.rank_load(ranks)
    assert drawn == figures.rank_load(ranks.clone())
    assert "id=" not in drawn and "<script" not in drawn
    # coordinates rounded to one decimal, text escaped
    coordinates = re.findall(r' (?:x|y|x1|y1|x2|y2|width|height)="([^"]+)"', drawn)
    assert len(coordinates) > 20
    assert all(re.fullmatch(r"-?\d+(\.\d)?", value) for value in coordinates), coordinates
    lags = pl.DataFrame({data.STALENESS: [1], data.ROWS: [5]})
    assert figures.staleness(lags) == figures.staleness(lags)
    rules = pl.DataFrame({data.RULE: ["a<b & c"], data.ROWS: [2]})
    assert "a&lt;b &amp; c" in figures.quarantine(rules)
    series: dict[str, list[float | None]] = {"a<": [1.0, None, 2.5], "b": [0.5, 0.5, 0.5]}
    trend = figures.trend([1, 2, 3], series, "x & y")
    assert "a&lt;" in trend and "x &amp; y" in trend
    assert trend == figures.trend([1, 2, 3], dict(series), "x & y")
    # the step without a value breaks the line in two
    assert re.search(r'<path d="M[^"]*M[^"]*" fill="none" stroke="#4c72b0"', trend)
