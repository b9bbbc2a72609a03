"""The index of an output root (`rollout-shards report ROOT`): a link to each committed
step's report and the trends across steps, from the steps' manifests alone."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StepError, Violation
from pipeline.io import writer
from pipeline.manifest import MANIFEST, Manifest
from pipeline.report import REPORT, page
from pipeline.transforms import metrics as m

RULE = "report_root"


@dataclass(frozen=True)
class Trends:
    """One value per committed step, by step (None where a step has no such value)."""

    steps: list[int]
    raw_reward: list[float | None]
    zero_std_ratio: list[float | None]
    response_mean: list[float | None]
    response_max: list[float | None]
    truncated_ratio: list[float | None]
    imbalance: list[float | None]
    staleness_max: list[float | None]  # the step less its oldest weight version
    staleness_mean: list[float | None]  # the step less the mean of its rows' oldest versions
    quarantined: list[float | None]


def _refuse(root: Path, message: str) -> StepError:
    return StepError([Violation(rule=RULE, message=message, files=[str(root)])])


def committed(root: Path) -> list[Manifest]:
    """The manifest of every committed step (`step=<N>/manifest.json`) under `root`, by
    step; StepError when `root` is no output root or a manifest does not read."""
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise _refuse(root, f"{what}: give an output root of `rollout-shards build`")
    manifests = []
    for folder in root.glob("step=*"):
        path = folder / MANIFEST
        if not folder.name.removeprefix("step=").isdigit() or not path.is_file():
            continue  # not a step folder, or one not committed
        try:
            manifests.append(Manifest.from_json(path.read_bytes()))
        except (OSError, ValueError) as exc:
            raise _refuse(path, f"not a step manifest ({type(exc).__name__}: {exc})") from exc
    if not manifests:
        raise _refuse(root, f"no committed step (step=<N>/{MANIFEST}) under it")
    return sorted(manifests, key=lambda manifest: manifest.step)


def trends(manifests: list[Manifest]) -> Trends:
    def stat(name: str) -> list[float | None]:
        return [manifest.stats.get(name) for manifest in manifests]

    def lag(name: str) -> list[float | None]:
        return [
            None if (v := manifest.stats.get(name)) is None else manifest.step - v
            for manifest in manifests
        ]

    return Trends(
        steps=[manifest.step for manifest in manifests],
        raw_reward=stat(m.RAW_REWARD),
        zero_std_ratio=stat(m.ZERO_STD_RATIO),
        response_mean=stat(m.RESPONSE_LEN + "mean"),
        response_max=stat(m.RESPONSE_LEN + "max"),
        truncated_ratio=stat(m.TRUNCATED_RATIO),
        imbalance=stat(m.RANK_TOKENS_MAX_OVER_MEAN),
        staleness_max=lag(m.WEIGHT_VERSION + "min"),
        staleness_mean=lag(m.WEIGHT_VERSION + "mean"),
        quarantined=[float(manifest.counts.quarantined) for manifest in manifests],
    )


def _link(root: Path, target: Path, manifest: Manifest) -> str:
    if manifest.report is None:
        return "none (built by a version without reports or their extra)"
    href = os.path.relpath(writer.step_folder(root, manifest.step) / manifest.report, target.parent)
    return f'<a href="{html.escape(Path(href).as_posix())}">step {manifest.step}</a>'


def index_page(root: Path, target: Path, manifests: list[Manifest]) -> str:
    """The index page of `root`'s committed steps, its links relative to `target`."""
    from pipeline.report import figures  # imported when a page is drawn

    t = trends(manifests)
    rows = "".join(
        f"<tr><td>{manifest.step}</td><td>{_link(root, target, manifest)}</td>"
        f"<td>{manifest.counts.ingested}</td><td>{manifest.counts.quarantined}</td>"
        f"<td>{manifest.counts.written}</td></tr>"
        for manifest in manifests
    )
    charts = [
        ("rewards", "Mean raw reward", {"raw reward": t.raw_reward}, "reward"),
        ("one-reward", "Share of prompt groups with one reward", {"": t.zero_std_ratio}, "share"),
        (
            "lengths",
            "Response lengths (mean and max)",
            {"mean": t.response_mean, "max": t.response_max},
            "tokens",
        ),
        ("truncated", "Share of samples truncated", {"": t.truncated_ratio}, "share"),
        ("imbalance", "Largest rank's tokens over the mean", {"": t.imbalance}, "max / mean"),
        (
            "staleness",
            "Weight-version lag (step less oldest version: max, mean)",
            {"max": t.staleness_max, "mean": t.staleness_mean},
            "versions",
        ),
        ("quarantined", "Quarantined rows", {"": t.quarantined}, "rows"),
    ]
    body = "".join(
        f"<h2>{html.escape(title)}</h2>\n"
        + page.figure(name, title, figures.trend(t.steps, series, label))
        for name, title, series, label in charts
    )
    return (
        page.head(f"rollout-shards report of {root.name}")
        + f"<h1>Steps of {html.escape(str(root))}</h1>\n"
        + "<table><tr><th>step</th><th>report</th><th>ingested</th><th>quarantined</th>"
        + f"<th>written</th></tr>{rows}</table>\n"
        + body
        + "</body></html>\n"
    )


def write_index(root: Path, target: Path | None = None) -> Path:
    """Write the index of `root` to `target` (default `root/report.html`), atomically."""
    manifests = committed(root)
    target = target if target is not None else root / REPORT
    writer.write_text_atomically(target, index_page(root, target, manifests))
    return target
