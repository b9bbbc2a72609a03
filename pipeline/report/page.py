"""A step's report page: one self-contained HTML file (inline SVG, inline CSS, no script)."""

from __future__ import annotations

import html

from pipeline.report import data as d
from pipeline.report import figures

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 62em; color: #222; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
"""


def head(title: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
    )


def table(header: list[str], rows: list[list[object]]) -> str:
    cells = "".join(f"<th>{html.escape(str(name))}</th>" for name in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(value))}</td>" for value in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>\n"


def figure(name: str, caption: str, svg: str) -> str:
    return f'<figure id="{name}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>\n'


def _flops(numbers: d.StepFigures) -> str:
    """FLOPs per rank where the step was built with the model's shape, else why not."""
    if not numbers.has_flops:
        return (
            "<p>FLOPs per rank need the model's shape: build with the shape flags "
            "(<code>--num-layers --hidden-size --ffn-hidden-size --num-attention-heads "
            "--vocab-size</code>, miles and slime) to draw them here.</p>\n"
        )
    return figure(
        "flops",
        "Forward FLOPs each data-parallel rank trains on (the trainer's estimate from the "
        "model's shape, as `rollout-shards plan` counts them), against their mean.",
        figures.rank_load(numbers.ranks, d.FLOPS),
    )


def step_page(numbers: d.StepFigures) -> str:
    """The report of one step."""
    manifest = numbers.manifest
    n = manifest.counts
    counts = table(
        ["ingested", "quarantined", "trimmed", "dropped", "written", "untrained"],
        [[n.ingested, n.quarantined, n.trimmed, n.dropped, n.written, n.untrained]],
    )
    settings = manifest.settings
    shown = table(
        ["trainer", "dp_size", "global batch", "train steps"],
        [
            [
                settings.get("trainer", "miles"),
                manifest.dp_size,
                manifest.global_batch_size,
                manifest.num_train_steps,
            ]
        ],
    )
    reasons = table(
        ["index", "leaf", "reason"],
        [list(row) for row in numbers.quarantined.rows()],  # at most QUARANTINE_SHOWN
    )
    return (
        head(f"rollout-shards step {numbers.step}")
        + f"<h1>Step {numbers.step}</h1>\n"
        + '<p><a href="../report.html">all steps</a> (the index `rollout-shards report` '
        + "writes, or its `--serve` draws)</p>\n"
        + "<h2>Rows</h2>\n"
        + counts
        + shown
        + "<h2>Rewards per prompt group</h2>\n"
        + figure(
            "rewards",
            "Mean raw reward of each prompt group; grey: groups whose samples share one reward.",
            figures.group_rewards(numbers.reward_bins),
        )
        + "<h2>Response lengths and truncation</h2>\n"
        + figure(
            "lengths",
            "Response length of each written sample; truncated samples stacked on top.",
            figures.response_lengths(numbers.length_bins),
        )
        + "<h2>Load per rank</h2>\n"
        + figure(
            "ranks",
            "Tokens (total lengths) each data-parallel rank trains on, against their mean.",
            figures.rank_load(numbers.ranks),
        )
        + _flops(numbers)
        + table(numbers.ranks.columns, [list(row) for row in numbers.ranks.rows()])
        + "<h2>Staleness</h2>\n"
        + figure(
            "staleness",
            "Samples per weight-version lag: the step less the oldest numeric weight version.",
            figures.staleness(numbers.staleness),
        )
        + "<h2>Quarantine</h2>\n"
        + figure(
            "quarantine",
            "Quarantined rows per rule (a row counts under each rule it broke).",
            figures.quarantine(numbers.rules),
        )
        + f"<p>The first {d.QUARANTINE_SHOWN} quarantined rows and why:</p>\n"
        + reasons
        + "</body></html>\n"
    )
