"""Write the bad-input corpus: one folder per case, holding `input/` (the files a user
might hand to `rollout-shards`) and `case.json` (what the command must do with them).

    python tests/core/bad_inputs/generate.py OUT_DIR

Every case is a valid step 7 of eight rows (built with `--global-batch-size 4`) with one
thing broken. `case.json` holds:

- `command`: what runs the case: `build` (most cases: `build input --out out ARGS`),
  `validate` (`validate input ARGS`), `parity` (`parity ARGS`: both sides are in `args`),
  or `stage`: the function the Dagster assets run, `pipeline.step.stages.run_stages`, with
  roots `input` and `out` and `args` (stage names joined by commas, the step, the settings
  as JSON), in a `python -c` subprocess that prints an error as the Dagster failure's
  description (the CLI's lines) and exits as the CLI would;
- `args`: extra command-line flags (for `build` and `validate`, after `--global-batch-size
  4`);
- `prepare` (parity): what the runner does before the command, in order: `{"build": D}`
  builds `input/` into the case folder's `D` as `build` would (it must succeed),
  `{"copy": [A, B]}` copies a file or folder, `{"replace": [F, OLD, NEW]}` replaces the
  one occurrence of OLD in the text of F, `{"write": [F, HEX]}` overwrites F with bytes
  (paths under the case folder);
- `lines`: when given, the exact stderr lines after the prefix (`rollout-shards: <command>:
  `, or `rollout-shards: usage error: ` for exit 2; `stage` prints `build`'s lines, as
  the Dagster failure does);
- `report`: when given, the JSON the command prints on stdout (`--format json`), which
  must parse as strict JSON (no bare NaN or Infinity) and equal it;
- `exit`: the expected exit status;
- `errors`: one entry per broken rule, in any order, each with `rule`, `step` (or null),
  `files` (paths under `input/`, or []), `rows` (the (index, leaf) pairs the line names,
  [] when the problem names none; `more`: how many rows it counts beyond those five) and
  `text` (a phrase the line must contain);
- `outcome` (exit 0 only): the manifest's `counts`, `ignored_columns` and
  `skipped_files` (paths under `input/`), and the quarantined rows as (index, leaf,
  reason) in batch order;
- `usage` (exit 2 only): a phrase of the one `rollout-shards: usage error: ` line;
- `notes`: paths under `input/` that a `rollout-shards: note: skipped` line names.

In `args`, `lines` and `report`, `{input}` and `{case}` stand for the case's `input/`
folder and the case folder. Besides the files under `input/`, a case may hold symlinks
(`links`, name to target), FIFOs (`fifos`) and files beside `input/` (`outside`, e.g. an
`out` in the way), and folders (`folders`), symlinks (`case_links`), FIFOs (`case_fifos`)
and Unix sockets (`sockets`) under the case folder (e.g. an `out/.staging` linked
elsewhere, a FIFO given as `--config`). In folder names `{host}` stands for this host's
name as a build writes it into its private folders.

Some cases run the command as a program in a way only a process can be run (always as a
subprocess, `build` of `input` into `out`):

- `stdout`: `closed` (started with standard output closed, as `build ... >&-`) or `broken`
  (its reader reads one line and goes away, as `build ... | head -1`);
- `signal`: `SIGINT` or `SIGTERM`, sent while the build waits for step 7's lock (held by
  the runner): the process ends by that signal, printing nothing;
- `built`: the steps whose folders the command commits (the others: none), whatever its
  exit status; `lines` then holds the exact stderr lines;
- `kept` and `gone`: paths under the case folder that exist, or do not, afterwards.

`metrics` runs `rollout-shards metrics ARGS`.

The cases that are the valid step with one rule broken by the fields of a few rows are data,
in `cases.yaml` beside this script (read by `table_cases`); the others are written out here.
The corpus is deterministic: the same script writes the same bytes.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import pickle
import re
import socket
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import yaml

# The contract's column types (CONTRACT.md section 1), written out here so the corpus
# states the contract independently of the pipeline's code.
CONTRACT_TYPES: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "group_index": pl.Int64(),
    "index": pl.Int64(),
    "leaf": pl.Int32(),
    "rollout_id": pl.Int64(),
    "session_version": pl.String(),
    "status": pl.String(),
    "tokens": pl.List(pl.Int32()),
    "response_length": pl.Int32(),
    "loss_mask": pl.List(pl.Int8()),
    "reward": pl.Float64(),
    "remove_sample": pl.Boolean(),
    "rollout_log_probs": pl.List(pl.Float32()),
    "teacher_log_probs": pl.List(pl.Float32()),
    "weight_versions": pl.List(pl.String()),
    "raw_reward": pl.Float64(),
    "round_number": pl.Int64(),
    "train_metadata": pl.String(),
    "prompt": pl.String(),
    "metadata": pl.String(),
}

STEP = 7
ARGS = ["--global-batch-size", "4"]
# The commands that take the settings flags (the others get `args` as they are).
SETTINGS_COMMANDS = ("build", "validate")
QUARANTINE = ["--on-invalid", "quarantine"]
SIBLING = "sibling of an invalid leaf: "

Row = dict[str, Any]


def sample(index: int, leaf: int = 0, **fields: Any) -> Row:
    """One valid row: four prompt tokens and a response of two."""
    row: Row = {
        "step": STEP,
        "group_index": index // 4,
        "index": index,
        "leaf": leaf,
        "status": "completed",
        "tokens": [11, 12, 13, 14, 15, 16],
        "response_length": 2,
        "reward": float(index % 2),
    }
    row.update(fields)
    return row


def base(**changes: Row) -> list[Row]:
    """The valid step; `changes` maps "row<k>" to fields replaced on row k."""
    rows = [sample(i) for i in range(8)]
    for key, fields in changes.items():
        rows[int(key.removeprefix("row"))].update(fields)
    return rows


def miles_dump(samples: list[Row]) -> bytes:
    """A miles dump as `torch.save` lays it out (a zip holding `archive/data.pkl`, the
    pickled `{rollout_id, metadata, samples}`), written with the standard library: plain
    values need no tensor storages. Fixed timestamps keep the bytes the same."""
    payload = {"rollout_id": STEP, "metadata": {}, "samples": samples}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in (
            ("archive/data.pkl", pickle.dumps(payload, protocol=2)),
            ("archive/byteorder", b"little"),
            ("archive/version", b"3\n"),
        ):
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def miles_sample(index: Any) -> Row:
    """Part of what miles' `Sample.to_dict()` holds, for row `index` of the valid step."""
    return {
        "group_index": 0,
        "index": index,
        "rollout_id": None,
        "prompt": "What is 2+2?",
        "tokens": [11, 12, 13, 14, 15, 16],
        "response_length": 2,
        "reward": 1.0,
        "loss_mask": None,
        "remove_sample": False,
        "status": "completed",
        "metadata": {},
    }


def frame(rows: list[Row], types: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
    """Rows as a table with the contract's types, except where `types` says otherwise."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    schema = {**CONTRACT_TYPES, **(types or {})}
    return pl.DataFrame(
        [pl.Series(name, [row.get(name) for row in rows], schema.get(name)) for name in names]
    )


def parquet(rows: list[Row], types: dict[str, pl.DataType] | None = None) -> bytes:
    buffer = io.BytesIO()
    frame(rows, types).write_parquet(buffer)
    return buffer.getvalue()


def jsonl(rows: list[Row]) -> bytes:
    # Python's json writes NaN and Infinity for non-finite floats, as a user's dump would.
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@dataclass
class Case:
    name: str
    what: str
    files: dict[str, bytes]
    exit: int = 1
    errors: list[dict[str, Any]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    usage: str = ""
    notes: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)
    fifos: list[str] = field(default_factory=list)
    outside: dict[str, bytes] = field(default_factory=dict)
    command: str = "build"
    lines: list[str] = field(default_factory=list)
    report: Any = None
    prepare: list[dict[str, Any]] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    case_links: dict[str, str] = field(default_factory=dict)
    case_fifos: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    stdout: str | None = None
    signal: str | None = None
    built: list[int] | None = None
    kept: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)

    def with_file(self, name: str, data: bytes) -> Case:
        """This case with its one input file `name` holding `data` instead."""
        self.files = {name: data}
        return self


def error(
    rule: str,
    rows: list[tuple[Any, Any]] | None = None,
    files: list[str] | None = None,
    text: str = "",
    step: int | None = STEP,
    more: int = 0,
) -> dict[str, Any]:
    """`rows` are the first five the line names, `more` how many it counts beyond them."""
    spec = {
        "rule": rule,
        "step": step,
        "files": files if files is not None else [f"step={STEP}.parquet"],
        "rows": [list(pair) for pair in rows or []],
        "text": text,
    }
    return {**spec, "more": more} if more else spec


def invalid(name: str, what: str, rows: list[Row], rule: str, where: list, text: str = "") -> Case:
    """A Parquet step with one broken rule naming rows `where`."""
    return Case(
        name, what, {f"step={STEP}.parquet": parquet(rows)}, 1, [error(rule, where, None, text)]
    )


def json_invalid(name: str, what: str, rows: list[Row], rule: str, where: list, text: str) -> Case:
    """A JSON Lines step with one broken rule naming rows `where`."""
    files = [f"step={STEP}.jsonl"]
    return Case(name, what, {files[0]: jsonl(rows)}, 1, [error(rule, where, files, text)])


TABLE = Path(__file__).with_name("cases.yaml")


class Loader(yaml.CSafeLoader):
    """YAML with `.nan` read as Python's NaN: PyYAML's is a negative NaN, whose sign bit a
    Parquet file would keep. (libyaml's parser: the table is read when the tests are
    collected, by every pytest worker.)"""


def _float(loader: yaml.CSafeLoader, node: yaml.ScalarNode) -> float:
    if loader.construct_scalar(node).lower() == ".nan":
        return math.nan
    return float(loader.construct_yaml_float(node))


Loader.add_constructor("tag:yaml.org,2002:float", _float)


@functools.cache
def _table() -> dict[str, list[dict[str, Any]]]:
    table: dict[str, list[dict[str, Any]]] = yaml.load(TABLE.read_text(), Loader)
    return table


def table_cases(group: str) -> list[Case]:
    """The cases of `group` in cases.yaml, each the valid step with fields replaced on every
    row (`every`) and on a few (`rows`), and rows replaced by several (`leaves`), written
    as Parquet (`invalid`) or JSON Lines (`json_invalid`), with one rule broken."""
    build = {"parquet": invalid, "jsonl": json_invalid}
    listed = []
    for case in _table()[group]:
        every, changed, leaves = case.get("every", {}), case.get("rows", {}), case.get("leaves", {})
        rows = []
        for i in range(8):
            if i in leaves:
                rows += [sample(i, **fields) for fields in leaves[i]]
            else:
                rows.append({**sample(i), **every, **changed.get(i, {})})
        named = [tuple(pair) for pair in case["named"]]
        text = case.get("text", "")
        listed.append(
            build[case["file"]](case["name"], case["what"], rows, case["rule"], named, text)
        )
    return listed


def quarantined(
    name: str,
    what: str,
    files: dict[str, bytes],
    counts: dict[str, int],
    rows: list[tuple[int, int, str]],
) -> Case:
    outcome = {
        "counts": counts,
        "ignored_columns": [],
        "skipped_files": [],
        "quarantine": [list(r) for r in rows],
    }
    return Case(name, what, files, 0, [], QUARANTINE, outcome)


def counts(ingested: int, quarantined: int, trimmed: int, written: int) -> dict[str, int]:
    return {
        "ingested": ingested,
        "quarantined": quarantined,
        "repaired": 0,
        "trimmed": trimmed,
        "dropped": 0,
        "written": written,
        "untrained": 0,
    }


V2 = {"session_version": "v2"}
MASK_LENGTH = "loss_mask_length: loss_mask length must equal response_length"
FINITE = "reward_finite: reward must be a finite number on every row"


def kept_whole(index: int, leaf: int, rules: str) -> str:
    """The reason of a row set aside with its reward group (SEMANTICS 5.4): the rows of one
    `group_index` (four here) are normalized together, so they go together."""
    return (
        "reward_group_kept_whole: its reward group (the rows sharing its group_index) lost "
        f"row (index {index}, leaf {leaf}) to {rules}, so it is set aside whole (its rewards "
        "would be normalized without that row)"
    )


def group_aside(index: int, rule: str, reason: str) -> list[tuple[int, int, str]]:
    """The quarantine of row (index, 0) for `reason`, with the rest of its reward group (the
    four rows sharing its group_index) set aside whole for `rule`."""
    group = range(index // 4 * 4, index // 4 * 4 + 4)
    return [(i, 0, reason if i == index else kept_whole(index, 0, rule)) for i in group]


def column_cases() -> list[Case]:
    """Each contract column with a value of the wrong type or an impossible value."""
    return [
        *table_cases("columns"),
        stored_as(
            "tokens_stored_as_text",
            "tokens written as one string per row",
            "tokens",
            ["11 12 13 14 15 16"] * 8,
            pl.String(),
            "column tokens must be List(Int32), but the file stores it as String; "
            'file row 1 holds "11 12 13 14 15 16"',
        ),
        stored_as(
            "tokens_stored_as_structs",
            "tokens written as a list of one-field structs per row",
            "tokens",
            [[{"id": t} for t in range(11, 17)]] * 8,
            pl.List(pl.Struct({"id": pl.Int32()})),
            "column tokens must be List(Int32), but the file stores it as "
            "List(Struct({'id': Int32})); file row 1 holds",
        ),
        Case(
            "reward_struct_without_reward_key",
            "a struct reward and no reward_key setting",
            {
                f"step={STEP}.parquet": parquet(
                    base(**{f"row{i}": {"reward": {"score": 1.0}} for i in range(8)}),
                    {"reward": pl.Struct({"score": pl.Float64()})},
                )
            },
            1,
            [error("reward_key", [], None, "set reward_key to the field to train on")],
        ),
        stored_as(
            "remove_sample_two",
            "remove_sample stored as integers (2 on row 3): an integer is not a boolean",
            "remove_sample",
            [2 if i == 3 else 0 for i in range(8)],
            pl.Int64(),
            "column remove_sample must be Boolean, but the file stores it as Int64; "
            "file row 1 holds 0",
        ),
    ]


def rule_cases() -> list[Case]:
    """Each rule across rows broken once."""
    return [
        *table_cases("rules"),
        Case(
            "step_column_disagrees_with_folder_name",
            "step 9 inside step=7/part-1.parquet",
            {
                "step=7/part-0.parquet": parquet(base()[:4]),
                "step=7/part-1.parquet": parquet(base(row5={"step": 9})[4:]),
            },
            1,
            [error("step_matches_path", [(5, 0)], ["step=7/part-1.parquet"])],
        ),
        Case(
            "two_rules_in_one_file",
            "status done on row 1 and a short mask on row 4",
            {
                f"step={STEP}.parquet": parquet(
                    base(row1={"status": "done"}, row4={"loss_mask": [1]})
                )
            },
            1,
            [error("status_isin", [(1, 0)]), error("loss_mask_length", [(4, 0)])],
        ),
        Case(
            "too_few_samples",
            "three rows for a global batch of 4",
            {f"step={STEP}.parquet": parquet(base()[:3])},
            1,
            [error("not_enough_samples", [], [], "not enough samples 3 for global_batch_size 4")],
        ),
    ]


def file_cases() -> list[Case]:
    """Files that are not tables, and files that do not say which step they are."""
    good = parquet(base())
    return [
        Case(
            "empty_parquet",
            "a Parquet file of zero bytes",
            {f"step={STEP}.parquet": b""},
            1,
            [error("unreadable_file", [], None, "the file is empty")],
        ),
        Case(
            "empty_jsonl",
            "a JSON Lines file of zero bytes",
            {f"step={STEP}.jsonl": b""},
            1,
            [error("unreadable_file", [], [f"step={STEP}.jsonl"], "the file is empty")],
        ),
        Case(
            "truncated_parquet",
            "a Parquet file cut in half",
            {f"step={STEP}.parquet": good[: len(good) // 2]},
            1,
            [error("unreadable_file", [], None, "cannot read parquet")],
        ),
        Case(
            "garbage_arrow",
            "an .arrow file of text",
            {f"step={STEP}.arrow": b"not arrow\n" * 20},
            1,
            [error("unreadable_file", [], [f"step={STEP}.arrow"], "cannot read ipc")],
        ),
        Case(
            "garbage_json_line",
            "line 3 of a JSON Lines file is not JSON",
            {f"step={STEP}.jsonl": jsonl(base()[:2]) + b"{index: 2, oops\n" + jsonl(base()[3:])},
            1,
            [error("unreadable_file", [], [f"step={STEP}.jsonl"], "line 3 is not a JSON object")],
        ),
        Case(
            "json_line_is_an_array",
            "line 5 of a JSON Lines file is an array",
            {f"step={STEP}.jsonl": jsonl(base()[:4]) + b"[4, 0]\n" + jsonl(base()[5:])},
            1,
            [
                error(
                    "unreadable_file",
                    [],
                    [f"step={STEP}.jsonl"],
                    "line 5 is not a JSON object (a list)",
                )
            ],
        ),
        Case(
            "missing_required_column",
            "no tokens column",
            {
                f"step={STEP}.parquet": parquet(
                    [{k: v for k, v in r.items() if k != "tokens"} for r in base()]
                )
            },
            1,
            [error("missing_column", [], None, "required column(s) tokens missing")],
        ),
        Case(
            "no_step_anywhere",
            "rows.parquet without a step column",
            {
                "rows.parquet": parquet(
                    [{k: v for k, v in r.items() if k != "step"} for r in base()]
                )
            },
            1,
            [error("missing_column", [], ["rows.parquet"], "no step in the file name", step=None)],
        ),
        Case(
            "step_column_null_without_file_step",
            "rows.parquet whose row 2 has no step",
            {"rows.parquet": parquet(base(row2={"step": None}))},
            1,
            [
                error(
                    "column_type",
                    [(2, 0)],
                    ["rows.parquet"],
                    "column step must hold a step number on every row",
                    step=None,
                )
            ],
        ),
        Case(
            "reward_struct_in_one_file_only",
            "a struct reward in one file, numbers in the other",
            {
                "step=7/part-0.parquet": parquet(base()[:4]),
                "step=7/part-1.parquet": parquet(
                    [dict(r, reward={"score": 1.0}) for r in base()[4:]],
                    {"reward": pl.Struct({"score": pl.Float64()})},
                ),
            },
            1,
            [
                error(
                    "column_type",
                    [],
                    ["step=7/part-1.parquet", "step=7/part-0.parquet"],
                    "every file of a step must store reward the same way",
                )
            ],
        ),
    ]


def accepted_cases() -> list[Case]:
    """Inputs that look odd but are valid."""
    full = counts(8, 0, 0, 8)
    return [
        Case(
            "extra_columns",
            "two columns the contract does not know",
            {
                f"step={STEP}.parquet": parquet(
                    [dict(r, judge="gpt", latency_ms=12.5) for r in base()]
                )
            },
            0,
            outcome={"counts": full, "ignored_columns": ["judge", "latency_ms"], "quarantine": []},
        ),
        Case(
            "chat_prompt_and_dict_metadata",
            "miles' list prompt and dict metadata in JSON Lines",
            {
                f"step={STEP}.jsonl": jsonl(
                    [
                        dict(
                            r,
                            prompt=[{"role": "user", "content": "hi"}],
                            metadata={"turns": 1},
                            train_metadata={"source": "gsm8k"},
                        )
                        for r in base()
                    ]
                )
            },
            0,
            outcome={"counts": full, "ignored_columns": [], "quarantine": []},
        ),
    ]


def quarantine_cases() -> list[Case]:
    """`--on-invalid quarantine`: exactly which rows are set aside, and why."""
    v2_pair = [sample(2, 0, rollout_id=2, **V2), sample(2, 1, rollout_id=2, **V2)]
    short_mask = [*base()[:2], v2_pair[0], dict(v2_pair[1], loss_mask=[1]), *base()[3:]]
    return [
        quarantined(
            "quarantine_a_whole_trajectory",
            "a short mask on one leaf of a v2 trajectory",
            {f"step={STEP}.parquet": parquet(short_mask)},
            counts(9, 5, 0, 4),
            [
                (0, 0, kept_whole(2, 1, "loss_mask_length")),
                (1, 0, kept_whole(2, 1, "loss_mask_length")),
                (2, 0, SIBLING + MASK_LENGTH),
                (2, 1, MASK_LENGTH),
                (3, 0, kept_whole(2, 1, "loss_mask_length")),
            ],
        ),
        quarantined(
            "quarantine_a_value_of_the_wrong_type",
            'a reward of "good" on row 5',
            {f"step={STEP}.jsonl": jsonl(base(row5={"reward": "good"}))},
            counts(8, 4, 0, 4),
            group_aside(5, "column_type", "column_type: column reward must be Float64"),
        ),
        quarantined(
            "quarantine_nan_and_step_mismatch",
            "a NaN reward on row 1, step 8 on row 3 (one prompt group)",
            {f"step={STEP}.parquet": parquet(base(row1={"reward": math.nan}, row3={"step": 8}))},
            counts(8, 4, 0, 4),
            [
                (0, 0, kept_whole(1, 0, "reward_finite")),
                (1, 0, FINITE),
                (2, 0, kept_whole(1, 0, "reward_finite")),
                (3, 0, "step_matches_path: step column disagrees with the step in the file path"),
            ],
        ),
        quarantined(
            "quarantine_duplicates",
            "row 3 written twice",
            {f"step={STEP}.parquet": parquet([*base()[:4], sample(3), *base()[4:]])},
            counts(9, 5, 0, 4),
            [
                (0, 0, kept_whole(3, 0, "unique_leaf")),
                (1, 0, kept_whole(3, 0, "unique_leaf")),
                (2, 0, kept_whole(3, 0, "unique_leaf")),
                (3, 0, "unique_leaf: (step, index, leaf) must be unique"),
                (3, 0, "unique_leaf: (step, index, leaf) must be unique"),
            ],
        ),
        quarantined(
            "quarantine_the_odd_rows_out",
            "log probs on one row of eight",
            {f"step={STEP}.parquet": parquet(base(row3={"rollout_log_probs": [-0.5, -0.5]}))},
            counts(8, 4, 0, 4),
            [
                (0, 0, kept_whole(3, 0, "rollout_log_probs_all_or_none")),
                (1, 0, kept_whole(3, 0, "rollout_log_probs_all_or_none")),
                (2, 0, kept_whole(3, 0, "rollout_log_probs_all_or_none")),
                (
                    3,
                    0,
                    "rollout_log_probs_all_or_none: "
                    "rollout_log_probs is null on some rows and set on others",
                ),
            ],
        ),
        Case(
            "quarantine_cannot_fix_a_truncated_file",
            "a truncated file fails the step anyway",
            {
                "step=7/part-0.parquet": parquet(base()[:4]),
                "step=7/part-1.parquet": parquet(base()[4:])[:100],
            },
            1,
            [error("unreadable_file", [], ["step=7/part-1.parquet"], "cannot read parquet")],
            QUARANTINE,
        ),
        Case(
            "quarantine_leaves_too_few",
            "every row but two is invalid (and so their prompt group)",
            {
                f"step={STEP}.parquet": parquet(
                    base(**{f"row{i}": {"status": "done"} for i in range(2, 8)})
                )
            },
            1,
            [
                error(
                    "not_enough_samples",
                    [],
                    [],
                    "not enough samples 0 for global_batch_size 4 (left after quarantining 8 rows",
                )
            ],
            QUARANTINE,
        ),
    ]


def without_leaf(rows: list[Row]) -> list[Row]:
    return [{k: v for k, v in row.items() if k != "leaf"} for row in rows]


def json_lines(rows: list[Row], replace: dict[int, str] | None = None) -> bytes:
    """JSON Lines with line k (0-based) replaced by raw text, for what json.dumps never
    writes (a key given twice)."""
    lines = [json.dumps(row) for row in rows]
    for k, text in (replace or {}).items():
        lines[k] = text
    return "".join(line + "\n" for line in lines).encode()


def usage(name: str, what: str, text: str, args: list[str], **fields: Any) -> Case:
    """A usage error (exit 2): one `rollout-shards: usage error: ` line holding `text`."""
    files = fields.pop("files", {f"step={STEP}.parquet": parquet(base())})
    return Case(name, what, files, 2, [], args, usage=text, **fields)


def accepted(
    name: str, what: str, files: dict[str, bytes], skipped: list[str], **fields: Any
) -> Case:
    outcome = {
        "counts": counts(8, 0, 0, 8),
        "ignored_columns": [],
        "skipped_files": skipped,
        "quarantine": [],
    }
    return Case(name, what, files, 0, [], [], outcome, notes=skipped, **fields)


def round_two_cases() -> list[Case]:
    """Issue 11: duplicated rows, JSON coercions, non-finite values, settings the data
    cannot meet, ambiguous paths, and failures that must be one line."""
    step_file = f"step={STEP}.parquet"
    json_file = f"step={STEP}.jsonl"
    valid = parquet(base())
    dup_key = json.dumps(sample(6))[:-1] + ', "index": 9}'
    return [
        *table_cases("round_two"),
        Case(
            "rows_repeated_in_a_second_file",
            "rows 2 and 3 again in a second file, without leaf: they became leaves 1",
            {
                "step=7/part-0.parquet": parquet(without_leaf(base())),
                "step=7/part-1.parquet": parquet(without_leaf(base()[2:4])),
            },
            1,
            [
                error(
                    "multi_leaf_only_in_v2",
                    [(2, 0), (3, 0), (2, 1), (3, 1)],
                    ["step=7/part-0.parquet", "step=7/part-1.parquet"],
                    "several rows share this index without session_version v2",
                )
            ],
        ),
        Case(
            "byte_identical_files",
            "one file copied twice into the step folder",
            {"step=7/a.parquet": valid, "step=7/b.parquet": valid},
            1,
            [
                error(
                    "identical_input_files",
                    [],
                    ["step=7/a.parquet", "step=7/b.parquet"],
                    "are byte-identical",
                )
            ],
        ),
        *(
            json_invalid(
                f"json_{name}_{label}",
                f"a JSON {label} in {name}",
                base(**{"row2": {name: value}}),
                "column_type",
                [(2, 0)],
                f"column {name} must be {CONTRACT_TYPES[name]}, got {shown} at file row 3",
            )
            for name, value, label, shown in [
                ("reward", True, "true", "true"),
                ("response_length", False, "false", "false"),
                ("group_index", True, "true", "true"),
                ("response_length", "2", "numeric_string", '"2"'),
                ("reward", "1.0", "numeric_string", '"1.0"'),
                (
                    "tokens",
                    [11, 12, 13, "14", 15, 16],
                    "numeric_string",
                    '[11, 12, 13, "14", 15, 16]',
                ),
                ("remove_sample", "false", "string", '"false"'),
            ]
        ),
        Case(
            "json_duplicate_key",
            "a line giving index twice",
            {json_file: json_lines(base(), {6: dup_key})},
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key index must appear once in each JSON object, but it is given twice "
                    "at file row 7",
                )
            ],
        ),
        quarantined(
            "quarantine_a_json_true",
            "a JSON true as reward, quarantined",
            {json_file: jsonl(base(row5={"reward": True}))},
            counts(8, 4, 0, 4),
            group_aside(5, "column_type", "column_type: column reward must be Float64"),
        ),
        quarantined(
            "quarantine_a_duplicate_key",
            "a key given twice, quarantined",
            {json_file: json_lines(base(), {6: dup_key})},
            counts(8, 4, 0, 4),
            group_aside(
                6, "duplicate_key", "duplicate_key: key index must appear once in each JSON object"
            ),
        ),
        Case(
            "dp_size_beyond_the_rows",
            "dp_size 16 for a step of eight rows kept whole (trimming off)",
            {step_file: valid},
            1,
            [error("not_enough_samples_for_dp_size", [], [], "dp_size 16 is larger")],
            ["--dp-size", "16", "--global-batch-size", "16", "--disable-rollout-trim-samples"],
        ),
        usage(
            "yaml_true_as_dp_size",
            "a YAML true where a number belongs",
            "invalid settings: dp_size: Input should be a valid integer",
            [],
            files={step_file: valid, "rollout-shards.yaml": b"dp_size: true\n"},
        ),
        usage(
            "config_is_binary",
            "--config pointing at a binary file",
            "is not a text (UTF-8) YAML file",
            ["--config", "{case}/config.bin"],
            outside={"config.bin": bytes(range(256))},
        ),
        Case(
            "dangling_symlink_as_a_step",
            "step=7.parquet a symlink to nothing",
            {},
            1,
            [error("unreadable_file", [], [step_file], "a dangling symlink")],
            links={step_file: "gone.parquet"},
        ),
        Case(
            "step_007_beside_step_7",
            "two spellings of step 7",
            {step_file: valid, "step=007/part.parquet": parquet(base()[:4])},
            1,
            [error("ambiguous_step_path", [], ["step=007", step_file], "both name step 7")],
        ),
        Case(
            "step_file_beside_step_folder",
            "step=7.parquet beside step=7/",
            {step_file: valid, "step=7/part.parquet": parquet(base()[:4])},
            1,
            [error("ambiguous_step_path", [], ["step=7", step_file], "both name step 7")],
        ),
        Case(
            "step_folder_inside_step_folder",
            "step=7/step=8/x.parquet",
            {"step=7/step=8/x.parquet": valid},
            1,
            [error("ambiguous_step_path", [], ["step=7", "step=7/step=8"], "one inside the other")],
        ),
        accepted(
            "upper_case_suffix_skipped",
            "step=7.PARQUET beside step=7.parquet",
            {step_file: valid, "step=7.PARQUET": valid},
            ["step=7.PARQUET"],
        ),
        accepted(
            "parq_suffix_skipped",
            "step=7.parq beside step=7.parquet",
            {step_file: valid, "step=7.parq": valid},
            ["step=7.parq"],
        ),
        accepted(
            "fifo_skipped",
            "a FIFO named step=7.arrow beside step=7.parquet",
            {step_file: valid},
            ["step=7.arrow"],
            fifos=["step=7.arrow"],
        ),
        usage(
            "out_is_the_input", "--out the input root", "is inside the input", ["--out", "{input}"]
        ),
        usage(
            "out_inside_the_input",
            "--out under the input root",
            "is inside the input",
            ["--out", "{input}/shards"],
        ),
        usage(
            "input_inside_out",
            "the input root under --out",
            "is inside --out",
            ["--out", "{case}"],
        ),
        usage(
            "out_is_a_file",
            "--out an existing file",
            "is a file, not a folder",
            ["--out", "{case}/out.txt"],
            outside={"out.txt": b"not a folder\n"},
        ),
        Case(
            "stepless_unreadable_file",
            "a truncated file without a step in its name beside a valid step",
            {step_file: valid, "extra.parquet": valid[:100]},
            1,
            [error("unreadable_file", [], ["extra.parquet"], "no step was built", step=None)],
        ),
        Case(
            "step_folder_is_a_file",
            "the step's folder under --out replaced by a plain file",
            {step_file: valid},
            1,
            [error("output_not_a_folder", [], [], "is a file, not a step folder")],
            outside={f"out/step={STEP}": b"not a folder\n"},
        ),
        Case(
            "dump_index_is_a_list",
            "a miles dump whose sample 3 has index [3]: a traceback (unhashable list) before",
            {
                "rollout_data/7.pt": miles_dump(
                    [miles_sample([i] if i == 3 else i) for i in range(8)]
                )
            },
            1,
            [
                error(
                    "malformed_dump",
                    [],
                    ["rollout_data/7.pt"],
                    "field index does not fit Int64 on sample 3 ([3])",
                )
            ],
        ),
        Case(
            "step_beyond_int64",
            "step=99999999999999999999999.parquet",
            {"step=99999999999999999999999.parquet": valid},
            1,
            [
                error(
                    "step_out_of_range",
                    [],
                    ["step=99999999999999999999999.parquet"],
                    "beyond int64",
                    step=None,
                )
            ],
        ),
    ]


# --- Settings YAML read strictly (issue 31 item 7) -------------------------------------
# A self-contained block: each case's settings file, beside the data or given with
# --config, is refused as one usage line (exit 2) naming the setting, before any step is
# read; the text is the line after the file's path.


def yaml_config_cases() -> list[Case]:
    data = {f"step={STEP}.parquet": parquet(base())}
    beside = "rollout-shards.yaml"

    def refused(name: str, what: str, text: str, line: str, config: bool = False) -> Case:
        if config:  # given with --config, outside the input root
            files = {"config": {"settings.yaml": text.encode()}}
            return usage(
                name,
                what,
                f"settings.yaml{line}",
                ["--config", "{case}/settings.yaml"],
                files=data,
                outside=files["config"],
            )
        return usage(name, what, f"{beside}{line}", [], files={**data, beside: text.encode()})

    def reads_otherwise(setting: str, text: str, older: str, newer: str) -> str:
        return (
            f", setting {setting}: {text!r} reads as {older} in YAML 1.1 and as {newer} in "
            "YAML 1.2: write the value you mean, or quote a text"
        )

    return [
        refused(
            "yaml_setting_given_twice",
            "dp_size twice in the settings beside the data (the last one used to win)",
            "dp_size: 2\nglobal_batch_size: 4\ndp_size: 4\n",
            " gives setting dp_size twice, on lines 1 and 3: keep one",
        ),
        refused(
            "yaml_setting_given_twice_in_config",
            "global_batch_size twice in a --config file",
            "global_batch_size: 4\nglobal_batch_size: 8\n",
            " gives setting global_batch_size twice, on lines 1 and 2: keep one",
            config=True,
        ),
        refused(
            "yaml_base_60_number",
            "global_batch_size: 1:04 (YAML 1.1 reads 64)",
            "global_batch_size: 1:04\n",
            reads_otherwise("global_batch_size", "1:04", "64", "the text '1:04'"),
        ),
        refused(
            "yaml_leading_zero_octal",
            "dp_size: 010 (YAML 1.1 reads 8, YAML 1.2 reads 10)",
            "dp_size: 010\n",
            reads_otherwise("dp_size", "010", "8", "10"),
        ),
        refused(
            "yaml_digits_grouped",
            "micro_batch_size: 1_000 (YAML 1.1 reads 1000, YAML 1.2 a text)",
            "micro_batch_size: 1_000\n",
            reads_otherwise("micro_batch_size", "1_000", "1000", "the text '1_000'"),
        ),
        refused(
            "yaml_5000_digit_integer",
            "global_batch_size of 5000 digits (Python refuses to read it: a traceback)",
            "global_batch_size: " + "9" * 5000 + "\n",
            ", setting global_batch_size: the integer "
            f"'{'9' * 20}...{'9' * 8} (5000 chars)' is beyond int64",
            config=True,
        ),
        refused(
            "yaml_nested_50000_deep",
            "dp_size nested 50,000 lists deep (PyYAML's composer recursed into a traceback)",
            "dp_size: " + "[" * 50_000 + "]" * 50_000 + "\n",
            ", setting dp_size: nested more than 32 levels deep",
        ),
        refused(
            "yaml_python_tag",
            "a !!python/object tag on a setting",
            "reward_key: !!python/object/apply:os.getcwd []\n",
            ", setting reward_key: the tag tag:yaml.org,2002:python/object/apply:os.getcwd "
            "is not read: write a plain value",
        ),
        refused(
            "yaml_setting_and_its_disable_flag",
            "rewards_normalization and disable_rewards_normalization both given",
            "rewards_normalization: true\ndisable_rewards_normalization: true\n",
            " sets both rewards_normalization and disable_rewards_normalization: keep one",
        ),
    ]


def arrow_table(rows: list[Row], columns: dict[str, pa.Array]) -> pa.Table:
    """The valid rows as Arrow, with `columns` replaced or added."""
    table = frame(rows).to_arrow()
    for name, values in columns.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, values)
        else:
            table = table.append_column(name, values)
    return table


def arrow_ipc(rows: list[Row], columns: dict[str, pa.Array]) -> bytes:
    table = arrow_table(rows, columns)
    sink = io.BytesIO()
    with pyarrow.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def arrow_parquet(rows: list[Row], columns: dict[str, pa.Array]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(arrow_table(rows, columns), sink)
    return sink.getvalue()


FIRST_FIVE = [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
ARROW_FILE = f"step={STEP}.arrow"


def stored_as(
    name: str,
    what: str,
    column: str,
    values: list[Any],
    dtype: pl.DataType,
    text: str,
    rows: list[tuple[Any, Any]] = FIRST_FIVE,
) -> Case:
    """A Parquet step whose `column` is stored as `dtype`: every row holding a value is
    refused, none is cast. The line names rows by the (index, leaf) values as stored."""
    written = base(**{f"row{i}": {column: value} for i, value in enumerate(values)})
    return Case(
        name,
        what,
        {f"step={STEP}.parquet": parquet(written, {column: dtype})},
        1,
        [error("column_type", rows, None, text, more=3)],
    )


def unsupported(name: str, what: str, data: bytes, text: str, file: str = ARROW_FILE) -> Case:
    return Case(name, what, {file: data}, 1, [error("unreadable_file", [], [file], text)])


def round_three_cases() -> list[Case]:
    """Issue 31: no silent coercion from any reader, no panic, no path that hides or moves
    a step, names that cannot forge a line; issue 30: partial and in-flight inputs."""
    rows = base()
    valid = parquet(rows)
    dec = pl.Decimal(10, 1)
    json_file = f"step={STEP}.jsonl"
    n = len(rows)
    last = json.dumps(sample(6))[:-1]
    weird = ["Step=7", "STEP=7", "step=+7", "step=7 ", "step=7.0"]
    # rollout_id stored as text, set on the two v2 leaves of trajectory 2
    leaves = [sample(2, 0, rollout_id="2", **V2), sample(2, 1, rollout_id="2", **V2)]
    text_ids = parquet([*rows[:2], *leaves, *rows[3:]], {"rollout_id": pl.String()})
    return [
        *table_cases("round_three"),
        stored_as(
            "parquet_index_as_strings",
            "index stored as text",
            "index",
            [str(i) for i in range(n)],
            pl.String(),
            'column index must be Int64, but the file stores it as String; file row 1 holds "0"',
        ),
        stored_as(
            "parquet_reward_as_strings",
            "reward stored as text",
            "reward",
            [str(float(i % 2)) for i in range(n)],
            pl.String(),
            "column reward must be Float64, but the file stores it as String",
        ),
        stored_as(
            "parquet_response_length_as_strings",
            "response_length stored as text",
            "response_length",
            ["2"] * n,
            pl.String(),
            "column response_length must be Int32, but the file stores it as String",
        ),
        stored_as(
            "parquet_tokens_as_lists_of_strings",
            "token ids stored as text",
            "tokens",
            [[str(t) for t in range(11, 17)]] * n,
            pl.List(pl.String()),
            "column tokens must be List(Int32), but the file stores it as List(String)",
        ),
        stored_as(
            "parquet_index_as_decimals",
            "index stored as Decimal, 2.5 on row 2 (was read as 2)",
            "index",
            [Decimal(i if i != 2 else "2.5") for i in range(n)],
            dec,
            "column index must be Int64, but the file stores it as Decimal(precision=10, scale=1)",
            [(0.0, 0), (1.0, 0), (2.5, 0), (3.0, 0), (4.0, 0)],
        ),
        stored_as(
            "parquet_tokens_as_decimals",
            "token ids stored as Decimal, 12.5 on row 0 (was read as 12)",
            "tokens",
            [
                [Decimal("12.5" if (i, t) == (0, 12) else t) for t in range(11, 17)]
                for i in range(n)
            ],
            pl.List(dec),
            "column tokens must be List(Int32), but the file stores it as List(Decimal(",
        ),
        stored_as(
            "parquet_index_as_floats",
            "index stored as float64",
            "index",
            [float(i) for i in range(n)],
            pl.Float64(),
            "column index must be Int64, but the file stores it as Float64",
            [(0.0, 0), (1.0, 0), (2.0, 0), (3.0, 0), (4.0, 0)],
        ),
        Case(
            "parquet_reward_integer_beyond_float64",
            "reward stored as int64 (integers are rewards), 2**53 + 1 on row 5",
            {
                f"step={STEP}.parquet": parquet(
                    base(
                        **{f"row{i}": {"reward": 2**53 + 1 if i == 5 else i % 2} for i in range(n)}
                    ),
                    {"reward": pl.Int64()},
                )
            },
            1,
            [
                error(
                    "column_type",
                    [(5, 0)],
                    None,
                    "column reward must be Float64, got 9007199254740993 at file row 6",
                )
            ],
        ),
        stored_as(
            "parquet_weight_versions_as_numbers",
            "weight_versions stored as lists of integers (were read as strings)",
            "weight_versions",
            [[3, 4]] * n,
            pl.List(pl.Int64()),
            "column weight_versions must be List(String), but the file stores it as List(Int64)",
        ),
        stored_as(
            "parquet_status_as_integers",
            "status stored as integers",
            "status",
            [1] * n,
            pl.Int64(),
            "column status must be String, but the file stores it as Int64",
        ),
        Case(
            "arrow_index_as_strings",
            "index stored as text in an Arrow file",
            {ARROW_FILE: arrow_ipc(rows, {"index": pa.array([str(i) for i in range(n)])})},
            1,
            [
                error(
                    "column_type",
                    FIRST_FIVE,
                    [ARROW_FILE],
                    "column index must be Int64, but the file stores it as String",
                    more=3,
                )
            ],
        ),
        Case(
            "parquet_rollout_id_as_strings_on_two_rows",
            "rollout_id stored as text, set on v2 leaves 2 and 3 only",
            {f"step={STEP}.parquet": text_ids},
            1,
            [
                error(
                    "column_type",
                    [(2, 0), (2, 1)],
                    None,
                    "column rollout_id must be Int64, but the file stores it as String; "
                    'file row 3 holds "2"',
                )
            ],
        ),
        quarantined(
            "quarantine_a_column_stored_as_text",
            "rollout_id stored as text on the two leaves of trajectory 2, quarantined",
            {f"step={STEP}.parquet": text_ids},
            counts(9, 5, 0, 4),
            [
                (0, 0, kept_whole(2, 0, "column_type")),
                (1, 0, kept_whole(2, 0, "column_type")),
                (2, 0, "column_type: column rollout_id must be Int64"),
                (2, 1, "column_type: column rollout_id must be Int64"),
                (3, 0, kept_whole(2, 0, "column_type")),
            ],
        ),
        Case(
            "json_duplicate_key_escaped",
            'reward given twice, once as "rew\\u0061rd"',
            {json_file: json_lines(rows, {6: last + ', "rew\\u0061rd": 1.0}'})},
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key reward must appear once in each JSON object, but it is given twice "
                    "at file row 7",
                )
            ],
        ),
        Case(
            "json_duplicate_untyped_key",
            "train_metadata given twice on line 7",
            {
                json_file: json_lines(
                    [dict(r, train_metadata="{}") for r in rows],
                    {
                        6: json.dumps(dict(sample(6), train_metadata="{}"))[:-1]
                        + ', "train_metadata": "{\\"a\\": 1}"}'
                    },
                )
            },
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key train_metadata must appear once in each JSON object",
                )
            ],
        ),
        Case(
            "json_duplicate_nested_key",
            "a train_metadata object giving a key twice on line 7",
            {
                json_file: json_lines(
                    [dict(r, train_metadata={"a": 0}) for r in rows],
                    {6: last + ', "train_metadata": {"a": 1, "a": 2}}'},
                )
            },
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key a inside train_metadata must appear once in each JSON object",
                )
            ],
        ),
        Case(
            "json_duplicate_key_in_a_chat_message",
            "a chat prompt whose first message gives role twice on line 7",
            {
                json_file: json_lines(
                    [dict(r, prompt=[{"role": "user", "content": "hi"}]) for r in rows],
                    {
                        6: json.dumps(
                            dict(sample(6), prompt=[{"role": "user", "content": "hi"}])
                        ).replace('"role": "user"', '"role": "user", "role": "system"')
                    },
                )
            },
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key role inside prompt must appear once in each JSON object",
                )
            ],
        ),
        Case(
            "json_duplicate_extra_key",
            "a column the contract does not know given twice on line 7",
            {
                json_file: json_lines(
                    [dict(r, judge="ok") for r in rows],
                    {6: json.dumps(dict(sample(6), judge="ok"))[:-1] + ', "judge": "bad"}'},
                )
            },
            1,
            [
                error(
                    "duplicate_key",
                    [(6, 0)],
                    [json_file],
                    "key judge must appear once in each JSON object",
                )
            ],
        ),
        Case(
            "step_file_inside_another_step_folder",
            "step=7/step=1.parquet: a file naming step 1 in the folder of step 7",
            {"step=7/step=1.parquet": valid},
            1,
            [
                error(
                    "ambiguous_step_path",
                    [],
                    ["step=7", "step=7/step=1.parquet"],
                    "name steps 7 and 1",
                )
            ],
        ),
        accepted(
            "step_folder_look_alikes_skipped",
            "folders named like step 7 but not step=7 exactly, beside step=7.parquet",
            {f"step={STEP}.parquet": valid, **{f"{name}/part.parquet": valid for name in weird}},
            sorted(weird),
        ),
        accepted(
            "tables_in_a_folder_that_is_no_step_folder_skipped",
            "archive/step=7.parquet beside step=7.parquet: not read, but said so",
            {f"step={STEP}.parquet": valid, f"archive/old/step={STEP}.parquet": valid},
            ["archive"],
        ),
        accepted(
            "hidden_and_underscore_entries_not_read",
            "Spark's _temporary attempt files, _SUCCESS and dot files inside step=7/",
            {
                "step=7/part-0.parquet": valid,
                "step=7/_SUCCESS": b"",
                "step=7/_temporary/0/_temporary/attempt_0/part-0.parquet": valid,
                "step=7/.part-1.parquet.crc": b"crc",
                "step=7/_part-1.parquet": valid,
                "step=7/.in-flight/part-1.parquet": valid,
                "_staging/step=7.parquet": valid,
            },
            [],
        ),
        Case(
            "success_marker_required",
            "--require-success-marker: step=7/ has _SUCCESS, step=8/ not yet (never read)",
            {
                "step=7/part-0.parquet": valid,
                "step=7/_SUCCESS": b"",
                "step=8/part-0.parquet": b"still being written",
            },
            0,
            [],
            ["--require-success-marker"],
            {
                "counts": counts(8, 0, 0, 8),
                "ignored_columns": [],
                "skipped_files": [],
                "quarantine": [],
            },
            notes=["step=8"],
        ),
        unsupported(
            "arrow_list_view_tokens",
            "tokens as an Arrow list_view (Polars panicked)",
            arrow_ipc(
                rows, {"tokens": pa.array([[11, 12, 13, 14, 15, 16]] * n, pa.list_view(pa.int32()))}
            ),
            "unsupported Arrow type list_view<item: int32> in column tokens",
        ),
        unsupported(
            "parquet_list_view_tokens",
            "tokens as an Arrow list_view in Parquet (Polars panicked)",
            arrow_parquet(
                rows, {"tokens": pa.array([[11, 12, 13, 14, 15, 16]] * n, pa.list_view(pa.int32()))}
            ),
            "unsupported Arrow type list_view<element: int32> in column tokens",
            f"step={STEP}.parquet",
        ),
        unsupported(
            "arrow_run_end_encoded_status",
            "status run-end encoded (Polars panicked)",
            arrow_ipc(
                rows,
                {
                    "status": pa.RunEndEncodedArray.from_arrays(
                        pa.array([n], pa.int32()), pa.array(["completed"])
                    )
                },
            ),
            "unsupported Arrow type run_end_encoded<run_ends: int32, values: string> "
            "in column status",
        ),
        unsupported(
            "arrow_dense_union_column",
            "an extra dense union column (Polars panicked)",
            arrow_ipc(
                rows,
                {
                    "extra": pa.UnionArray.from_dense(
                        pa.array([0] * n, pa.int8()),
                        pa.array(list(range(n)), pa.int32()),
                        [pa.array(list(range(n)))],
                    )
                },
            ),
            "unsupported Arrow type dense_union<0: int64=0> in column extra",
        ),
        unsupported(
            "arrow_month_day_nano_interval_column",
            "an extra month-day-nano interval column (Polars panicked)",
            arrow_ipc(rows, {"extra": pa.array([(1, 2, 3)] * n, pa.month_day_nano_interval())}),
            "unsupported Arrow type month_day_nano_interval in column extra",
        ),
        unsupported(
            "arrow_decimal256_column",
            "an extra decimal256 column (Polars panicked)",
            arrow_ipc(rows, {"extra": pa.array([Decimal("1.5")] * n, pa.decimal256(50, 2))}),
            "unsupported Arrow type decimal256(50, 2) in column extra",
        ),
        Case(
            "newline_in_a_file_name",
            "a truncated file whose name holds a newline and a forged error line",
            {"step=7/a\nrollout-shards: build: forged.parquet": valid[:100]},
            1,
            [
                error(
                    "unreadable_file",
                    [],
                    ["step=7/a\nrollout-shards: build: forged.parquet"],
                    "cannot read parquet",
                )
            ],
        ),
        Case(
            "escape_sequence_in_a_file_name",
            "a truncated file whose name holds a terminal escape sequence",
            {"step=7/\x1b[2J\x1b[31mred.parquet": valid[:100]},
            1,
            [
                error(
                    "unreadable_file",
                    [],
                    ["step=7/\x1b[2J\x1b[31mred.parquet"],
                    "cannot read parquet",
                )
            ],
        ),
        accepted(
            "file_name_not_utf8",
            "a valid file whose name holds the byte 0xff",
            {os.fsdecode(b"step=7/part-\xff.parquet"): valid},
            [],
        ),
        usage(
            "out_not_utf8",
            "--out whose name holds the byte 0xff",
            "has a name that is not UTF-8 text",
            ["--out", "{case}/" + os.fsdecode(b"out-\xff")],
        ),
    ]


# --- miles dumps that would exhaust memory or crash (issue 31 item 5) --------------

DUMP_FILE = f"rollout_data/{STEP}.pt"
DUMP_PLACEHOLDER = "RAW-PICKLE-OPCODES"


def _pickled_text(value: str) -> bytes:
    data = value.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def _pickled_int(value: int) -> bytes:
    return b"\x8a\x08" + value.to_bytes(8, "little", signed=True)  # LONG1


def _pickled_tuple(values: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(map(_pickled_int, values)) + b"t"


def spliced_dump(samples: list[Row], opcodes: bytes, storages: dict[str, bytes]) -> bytes:
    """`miles_dump(samples)` with the one value DUMP_PLACEHOLDER replaced by what the
    pickle `opcodes` build: written by hand, as a hostile file would be."""
    data = miles_dump(samples)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        pickled = archive.read("archive/data.pkl")
    assert pickled.count(_pickled_text(DUMP_PLACEHOLDER)) == 1
    pickled = pickled.replace(_pickled_text(DUMP_PLACEHOLDER), opcodes)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        entries = [
            ("archive/data.pkl", pickled),
            ("archive/byteorder", b"little"),
            ("archive/version", b"3\n"),
            *((f"archive/data/{key}", value) for key, value in storages.items()),
        ]
        for name, entry in entries:
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), entry)
    return buffer.getvalue()


def dump_with(position: int, **fields: Any) -> list[Row]:
    """The valid step's samples with `fields` replaced on sample `position`."""
    samples = [miles_sample(i) for i in range(8)]
    samples[position].update(fields)
    return samples


def dump_case(name: str, what: str, data: bytes, text: str, rule: str = "malformed_dump") -> Case:
    return Case(name, what, {DUMP_FILE: data}, 1, [error(rule, [], [DUMP_FILE], text)])


def dump_bound_cases() -> list[Case]:
    """What a dump may make the reader build is bounded by its own size; cycles, nesting
    and values of the wrong type are one malformed_dump line each, never a crash."""
    array = _pickled_tuple((400_000_000,)) + _pickled_text("f8") + b"tR"
    reconstruct = b"cnumpy._core.multiarray\n_reconstruct\n(cnumpy\nndarray\n" + array
    ndarray = b"cnumpy\nndarray\n(" + array
    storage = b"(" + _pickled_text("storage") + b"ctorch\nLongStorage\n"
    storage += _pickled_text("0") + _pickled_text("cpu") + _pickled_int(1) + b"tQ"
    zero_stride = (
        b"ctorch._utils\n_rebuild_tensor_v2\n("
        + storage
        + _pickled_int(0)
        + _pickled_tuple((400_000_000,))
        + _pickled_tuple((0,))
        + b"\x89ccollections\nOrderedDict\n)RtR"
    )
    beyond = "takes it beyond the 1,048,576 bytes of arrays a dump of"
    loop: dict[str, Any] = {"source": "gsm8k"}
    loop["self"] = loop
    tokens: list[Any] = [11, 12, 13, 14, 15]
    tokens.append(tokens)
    shared: list[Any] = list(range(10))
    for _ in range(64):
        shared = [shared, shared]
    depth = 100_000
    nested = b"]" * depth + b"a" * (depth - 1)
    placeholder = {"metadata": {"x": DUMP_PLACEHOLDER}}
    return [
        dump_case(
            "dump_array_beyond_its_size",
            "a 1 KB dump whose pickle asks numpy's _reconstruct for 4e8 float64 (3.2 GB)",
            spliced_dump(dump_with(3, **placeholder), reconstruct, {}),
            f"an array of shape (400000000,) {beyond}",
        ),
        dump_case(
            "dump_ndarray_called_beyond_its_size",
            "a dump whose pickle calls numpy.ndarray((400000000,), 'f8')",
            spliced_dump(dump_with(3, **placeholder), ndarray, {}),
            f"an array of shape (400000000,) {beyond}",
        ),
        dump_case(
            "dump_zero_stride_tensor",
            "a tensor of 4e8 elements with stride 0 over a one-element storage",
            spliced_dump(
                dump_with(3, tokens=DUMP_PLACEHOLDER), zero_stride, {"0": (7).to_bytes(8, "little")}
            ),
            f"a tensor of shape (400000000,) {beyond}",
        ),
        dump_case(
            "dump_declared_length_beyond_memory",
            "a BINBYTES8 opcode declaring 2**62 bytes",
            spliced_dump(dump_with(3, **placeholder), b"\x8e" + (2**62).to_bytes(8, "little"), {}),
            "asks for more memory than a dump of",
        ),
        dump_case(
            "dump_bytearray_of_a_size",
            "a pickle calling bytearray(4000000000)",
            spliced_dump(
                dump_with(3, **placeholder),
                b"c__builtin__\nbytearray\n(" + _pickled_int(4_000_000_000) + b"tR",
                {},
            ),
            "refused to unpickle: it needs bytearray of int",
            rule="unsafe_pickle",
        ),
        dump_case(
            "dump_self_referencing_metadata",
            "sample 3's metadata holds itself (json said: Circular reference detected)",
            miles_dump(dump_with(3, metadata=loop)),
            "field metadata on sample 3 ({'self': {'self': {'self': {...}, 'source': 'gsm8k'}, "
            "'source': 'gsm8k'}, 'so...): refers to itself (a cycle)",
        ),
        dump_case(
            "dump_self_containing_tokens",
            "sample 3's tokens list holds itself (Polars recursed into it and crashed)",
            miles_dump(dump_with(3, tokens=tokens)),
            "field tokens does not fit List(Int32) on sample 3 ([11, 12, 13, 14, 15, [11, 12, "
            "13, 14, 15, [11, 12, 13, 14, 15, [...]]]]): element 5 is the list itself (a cycle)",
        ),
        dump_case(
            "dump_deeply_nested_metadata",
            "sample 3's metadata nested 100,000 lists deep",
            spliced_dump(dump_with(3, **placeholder), nested, {}),
            "field metadata on sample 3 ({'x': [[[...]]]}): is not JSON text (RecursionError",
        ),
        dump_case(
            "dump_shared_structure_expanding",
            "sample 0's metadata: 64 levels of pairs of one list, 2**64 copies as JSON",
            miles_dump(dump_with(0, metadata={"x": shared})),
            "field metadata of sample 0 takes it beyond the 1,048,576 values a dump of",
        ),
        dump_case(
            "dump_numeric_weight_versions",
            "weight_versions 5 on sample 2 (a TypeError before)",
            miles_dump(dump_with(2, weight_versions=5)),
            "field weight_versions on sample 2 (5): a int where a list of versions belongs",
        ),
        dump_case(
            "dump_weight_versions_of_numbers",
            "weight_versions [1, 2] on sample 2 (read as the strings '1', '2' before)",
            miles_dump(dump_with(2, weight_versions=[1, 2])),
            "field weight_versions on sample 2 ([1, 2]): version 1 is a int, not a string",
        ),
        dump_case(
            "dump_remove_sample_two",
            "remove_sample 2 on sample 4 (read as true before)",
            miles_dump(dump_with(4, remove_sample=2)),
            "field remove_sample does not fit Boolean on sample 4 (2): TypeError",
        ),
    ]


# --- other commands on bad data: parity, validate --format json, staging (issue 31 item 8-9)

BUILT_SIDES = ["{case}/left", "{case}/right"]
# Build the valid step into left/ and copy it to right/: the two sides are the same build.
BUILT = [{"build": "left"}, {"copy": ["left", "right"]}]
RIGHT_STEP = f"right/step={STEP}"
UNEXPECTED_SHARD = (
    "a build writes rank=<K>.parquet with K from 0 to 2147483647; move the file out of the "
    "step folder to compare the build"
)


def parity_of_builds(name: str, what: str, corrupt: list[dict[str, Any]], line: str) -> Case:
    """`parity left right` on two builds of the valid step, the right one corrupted."""
    files = {f"step={STEP}.parquet": parquet(base())}
    return Case(
        name,
        what,
        files,
        command="parity",
        args=BUILT_SIDES,
        prepare=[*BUILT, *corrupt],
        lines=[line],
    )


def stray_shard(name: str, file: str, why: str) -> Case:
    return parity_of_builds(
        name,
        f"a copy of rank=0.parquet named {file!r} in the right build's step folder",
        [{"copy": [f"{RIGHT_STEP}/rank=0.parquet", f"{RIGHT_STEP}/{file}"]}],
        f"step {STEP}: {{case}}/{RIGHT_STEP}/{file}: rule unexpected_shard: {why}: "
        + UNEXPECTED_SHARD,
    )


def manifest_step(name: str, step: str, shown: str) -> Case:
    return parity_of_builds(
        name,
        f"the right build's manifest giving its step as {step}",
        [{"replace": [f"{RIGHT_STEP}/manifest.json", f'"step": {STEP},', f'"step": {step},']}],
        f"{{case}}/{RIGHT_STEP}/manifest.json: rule unreadable_file: not a step manifest: its "
        f"step {shown} is not an int64 step number",
    )


def parity_cases() -> list[Case]:
    """`rollout-shards parity` on stray shard names and manifests that are no step's: one
    line naming the file, never a traceback; `--format json` prints strict JSON."""
    return [
        stray_shard("parity_stray_rank_copy", "rank=0 (copy).parquet", "not a shard name"),
        stray_shard("parity_stray_rank_leading_zero", "rank=01.parquet", "not a shard name"),
        stray_shard(
            "parity_stray_rank_beyond_int32", "rank=3000000000.parquet", "a rank beyond int32"
        ),
        manifest_step("parity_manifest_step_1e400", "1e400", "inf"),
        manifest_step("parity_manifest_step_float", f"{STEP}.0", f"{STEP}.0"),
        manifest_step("parity_manifest_step_string", f'"{STEP}"', f'"{STEP}"'),
        manifest_step("parity_manifest_step_30_digits", "9" * 30, "9" * 30),
        manifest_step("parity_manifest_step_true", "true", "True"),
        parity_of_builds(
            "parity_manifest_not_json",
            "the right build's manifest.json holding bytes that are not UTF-8",
            [{"write": [f"{RIGHT_STEP}/manifest.json", b"\xff\xfe not json".hex()]}],
            f"{{case}}/{RIGHT_STEP}/manifest.json: rule unreadable_file: not a step manifest "
            "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte)",
        ),
        Case(
            "parity_json_non_finite_rewards",
            "parity --format json of two inputs, reward NaN on the left and inf on the right",
            {f"step={STEP}.parquet": parquet(base(row2={"reward": math.nan}))},
            1,
            command="parity",
            args=["{input}", "{case}/right", "--format", "json"],
            outside={f"right/step={STEP}.parquet": parquet(base(row2={"reward": math.inf}))},
            report={
                "mode": "inputs",
                "keys": ["step", "index", "leaf"],
                "left": "{input}",
                "right": "{case}/right",
                "rows": {"left": 8, "right": 8, "only_left": 0, "only_right": 0, "examples": []},
                "columns": [
                    {
                        "column": "reward",
                        "kind": "values",
                        "rows": 1,
                        "left_type": "Float64",
                        "right_type": "Float64",
                        "examples": [
                            {
                                "key": {"step": STEP, "index": 2, "leaf": 0},
                                "left": "nan",
                                "right": "inf",
                            }
                        ],
                    }
                ],
                "notes": [],
                "identical": False,
                "summary": "1 columns differ",
            },
        ),
    ]


def validated(
    name: str, what: str, file: str, data: bytes, message: str, rows: list[Any], n_rows: int
) -> list[Case]:
    """The same bad step through `validate --format json` and `validate` (the line): one
    verdict. `rows` are the indexes the report names, as strict JSON holds them (text for
    NaN and Decimal values, numbers otherwise); the line shows them as Python does."""
    shown = ", ".join(f"({index}, 0)" for index in rows)
    more = f" and {n_rows - len(rows)} more" if n_rows > len(rows) else ""
    violation = {
        "rule": "column_type",
        "message": message,
        "step": STEP,
        "files": [f"{{input}}/{file}"],
        "rows": [[index, 0] for index in rows],
        "n_rows": n_rows,
    }
    report = [{"step": STEP, "valid": False, "violations": [violation]}]
    line = f"step {STEP}: {{input}}/{file}: rule column_type: {message}; rows (index, leaf): "
    return [
        Case(
            f"validate_json_{name}",
            f"{what}, validate --format json",
            {file: data},
            command="validate",
            args=["--format", "json"],
            report=report,
        ),
        Case(
            f"validate_{name}", what, {file: data}, command="validate", lines=[line + shown + more]
        ),
    ]


def validate_json_cases() -> list[Case]:
    """`validate --format json` names rows by the values stored, as text where JSON has no
    number for them (NaN, Decimal): strict JSON, the same verdict as the text output."""
    n = len(base())
    decimals = [Decimal(i if i != 2 else "2.5") for i in range(n)]
    first_five = ["0.0", "1.0", "2.5", "3.0", "4.0"]
    return [
        *validated(
            "nan_index",
            "index NaN on line 3 of JSON Lines",
            f"step={STEP}.jsonl",
            jsonl(base(row2={"index": math.nan})),
            "column index must be Int64, got nan at file row 3",
            ["nan"],
            1,
        ),
        *validated(
            "decimal_index",
            "index stored as Decimal, 2.5 on row 2",
            f"step={STEP}.parquet",
            parquet(
                base(**{f"row{i}": {"index": decimals[i]} for i in range(n)}),
                {"index": pl.Decimal(10, 1)},
            ),
            "column index must be Int64, but the file stores it as Decimal(precision=10, "
            'scale=1); file row 1 holds "0.0"',
            first_five,
            n,
        ),
        *validated(
            "float_index_nan",
            "index stored as float64, NaN on row 0",
            f"step={STEP}.parquet",
            parquet(
                base(**{f"row{i}": {"index": math.nan if i == 0 else float(i)} for i in range(n)}),
                {"index": pl.Float64()},
            ),
            "column index must be Int64, but the file stores it as Float64; file row 1 holds nan",
            ["nan", 1.0, 2.0, 3.0, 4.0],
            n,
        ),
    ]


def staged_through_a_link(name: str, what: str, link: str, stages: list[str]) -> Case:
    """The Dagster stages (`run_stages`) of step 7 with `out/<link>` a symbolic link to the
    empty `elsewhere/` beside `out/`: refused naming the link, nothing staged through it."""
    target = "../" * link.count("/") + "../elsewhere"
    return Case(
        name,
        what,
        {f"step={STEP}.parquet": parquet(base())},
        2,
        command="stage",
        args=[",".join(stages), str(STEP), json.dumps({"global_batch_size": 4})],
        folders=["elsewhere"],
        case_links={f"out/{link}": target},
        lines=[
            f"{{case}}/out/{link} is a symbolic link to {target}: staged data must stay inside "
            "the output root {case}/out; remove the link"
        ],
    )


def staging_cases() -> list[Case]:
    """Dagster's staging under `<out>/.staging/` (the CLI never stages): a link anywhere on
    the way would put staged samples outside the output root, or read them from there."""
    return [
        staged_through_a_link(
            "staging_folder_is_a_link",
            "out/.staging linked elsewhere; rollout_samples materialized on its own stages",
            ".staging",
            ["rollout_samples"],
        ),
        staged_through_a_link(
            "staged_asset_folder_is_a_link",
            "out/.staging/rollout_samples linked elsewhere; rollout_samples on its own stages",
            ".staging/rollout_samples",
            ["rollout_samples"],
        ),
        staged_through_a_link(
            "staged_asset_folder_to_discard_is_a_link",
            "out/.staging/train_batch linked elsewhere; the three stages together discard it",
            ".staging/train_batch",
            ["rollout_samples", "train_batch", "training_shards"],
        ),
        staged_through_a_link(
            "staged_step_folder_is_a_link",
            "out/.staging/rollout_samples/step=7 linked elsewhere; train_batch on its own reads it",
            f".staging/rollout_samples/step={STEP}",
            ["train_batch"],
        ),
    ]


# A build's private folders name this host as the writer does (`pipeline.io.writer`).
HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"
# A process id beyond any Linux `pid_max` (2**22 at most), within a C `pid_t`: no process
# has it, so a folder naming it is a killed build's, and cleaning removes it.
GONE_PID = 2**22


def at_step(step: int, rows: list[Row]) -> list[Row]:
    return [dict(row, step=step) for row in rows]


def three_steps() -> dict[str, bytes]:
    """Steps 7 and 8 valid, step 9 with a response longer than its tokens."""
    return {
        f"step={STEP}.parquet": parquet(base()),
        "step=8.parquet": parquet(at_step(8, base())),
        "step=9.parquet": parquet(at_step(9, base(row3={"response_length": 9}))),
    }


STEP_9_LINE = (
    "step 9: {input}/step=9.parquet: rule response_within_tokens: response_length must be "
    "within 0..len(tokens); file row 4 has response_length 9, tokens 6; --on-invalid "
    "quarantine would set these trajectories aside and build the rest; rows (index, leaf): "
    "(3, 0)"
)


def refused_settings_file(name: str, what: str, usage_text: str, **fields: Any) -> Case:
    """`--config {case}/settings.yaml`, refused as a usage error holding `usage_text`."""
    return usage(name, what, usage_text, ["--config", "{case}/settings.yaml"], **fields)


def metrics_refused(name: str, what: str, args: list[str], line: str, **fields: Any) -> Case:
    """`metrics` of a build of the valid step into `out`, refused before writing."""
    return Case(
        name,
        what,
        {f"step={STEP}.parquet": parquet(base())},
        2,
        command="metrics",
        args=["{case}/out", *args],
        prepare=[{"build": "out"}],
        lines=[line],
        **fields,
    )


def bytes_columns(rows: list[Row]) -> dict[str, pa.Array]:
    return {"tokens": pa.array([bytes(row["tokens"]) for row in rows], pa.binary())}


def round_four_cases() -> list[Case]:
    """Issue 39: Arrow types no rule maps, stray private folders, step names in other
    digits, things that are not regular files where a file is read or replaced, a stdout
    that goes away, keys given twice with null, and interrupted builds."""
    rows = base()
    valid = parquet(rows)
    json_file = f"step={STEP}.jsonl"
    last = json.dumps(sample(6))[:-1]
    char_device = "not a regular file (a character device)"
    fifo = "not a regular file (a FIFO)"
    kept_folders = [
        f"out/.tmp-step={STEP}-{{host}}-{'9' * 23}-0123abcd",
        f"out/.tmp-spill-step={STEP}-{{host}}-{2**32}-0123abcd",
        f"out/.old-step={STEP}-{{host}}-0-0123abcd",
        f"out/.tmp-step={STEP}-{{host}}-\u0661\u0662\u0663-0123abcd",
        f"out/.tmp-step={STEP}-an.other.host-1-0123abcd",
    ]
    gone_folder = f"out/.tmp-step={STEP}-{{host}}-{GONE_PID}-0123abcd"
    other_digits = [f"step={d}" for d in ("\u0667", "\u0667.parquet", "\uff17.parquet")]
    return [
        # 1. Arrow types no rule maps: bytes where numbers, text or lists belong.
        Case(
            "tokens_stored_as_bytes",
            "tokens stored as Arrow binary (the token ids' bytes): Polars panicked naming them",
            {ARROW_FILE: arrow_ipc(rows, bytes_columns(rows))},
            1,
            [
                error(
                    "column_type",
                    FIRST_FIVE,
                    [ARROW_FILE],
                    "column tokens must be List(Int32), but the file stores it as Binary; "
                    "file row 1 holds b'\\x0b\\x0c\\r\\x0e\\x0f\\x10'",
                    more=3,
                )
            ],
        ),
        Case(
            "status_stored_as_binary_view",
            "status stored as Arrow binary_view",
            {
                ARROW_FILE: arrow_ipc(
                    rows, {"status": pa.array([b"completed"] * len(rows), pa.binary_view())}
                )
            },
            1,
            [
                error(
                    "column_type",
                    FIRST_FIVE,
                    [ARROW_FILE],
                    "column status must be String, but the file stores it as Binary; "
                    "file row 1 holds b'completed'",
                    more=3,
                )
            ],
        ),
        Case(
            "reward_stored_as_fixed_size_binary",
            "reward stored in Parquet as 8-byte fixed_size_binary (a float64's bytes)",
            {
                f"step={STEP}.parquet": arrow_parquet(
                    rows,
                    {"reward": pa.array([b"\x00" * 8] * len(rows), pa.binary(8))},
                )
            },
            1,
            [
                error(
                    "column_type",
                    FIRST_FIVE,
                    None,
                    "column reward must be Float64, but the file stores it as Binary; "
                    "file row 1 holds b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'",
                    more=3,
                )
            ],
        ),
        Case(
            "metadata_as_a_list_of_bytes",
            "metadata (kept as JSON text) stored as a list of large_binary: JSON has no bytes",
            {
                ARROW_FILE: arrow_ipc(
                    rows, {"metadata": pa.array([[b"hi"]] * len(rows), pa.list_(pa.large_binary()))}
                )
            },
            1,
            [
                error(
                    "column_type",
                    FIRST_FIVE,
                    [ARROW_FILE],
                    "column metadata must be String, but the file stores it as List(Binary); "
                    "file row 1 holds [b'hi']",
                    more=3,
                )
            ],
        ),
        quarantined(
            "quarantine_a_file_of_bytes_tokens",
            "step 7 in two files, the second's tokens stored as binary: its rows set aside",
            {
                f"step={STEP}/a.parquet": arrow_parquet(rows[:4], {}),
                f"step={STEP}/b.parquet": arrow_parquet(rows[4:], bytes_columns(rows[4:])),
            },
            counts(8, 4, 0, 4),
            [(i, 0, "column_type: column tokens must be List(Int32)") for i in range(4, 8)],
        ),
        # 2. Stray private folders in the output root.
        accepted(
            "stray_private_folders_in_the_output_root",
            "leftover staging and spill folders naming an impossible process id (beyond "
            "pid_t, 0, other digits) or another host: left alone; a gone process's removed",
            {f"step={STEP}.parquet": valid},
            [],
            folders=[*kept_folders, gone_folder],
            kept=kept_folders,
            gone=[gone_folder],
        ),
        # 3. Step names whose digits are not ASCII.
        Case(
            "step_names_in_other_digits",
            "step=\u0667/ (Arabic-Indic 7), step=\u0667.parquet and step=\uff17.parquet "
            "(fullwidth 7) beside step=7.parquet, holding the same rows: not steps, a note each",
            {
                f"step={STEP}.parquet": valid,
                "step=\u0667/part.parquet": valid,
                "step=\u0667.parquet": valid,
                "step=\uff17.parquet": valid,
            },
            0,
            outcome={
                "counts": counts(8, 0, 0, 8),
                "ignored_columns": [],
                "skipped_files": other_digits,
                "quarantine": [],
            },
            notes=other_digits,
        ),
        # 4. Not a regular file where a file is read.
        refused_settings_file(
            "config_is_a_fifo",
            "--config names a FIFO (nothing writes to it): a read would wait for ever",
            f"settings.yaml cannot be read: {fifo}",
            case_fifos=["settings.yaml"],
        ),
        refused_settings_file(
            "config_is_a_device",
            "--config names /dev/zero (through a link): a read would never end",
            f"settings.yaml cannot be read: {char_device}",
            case_links={"settings.yaml": "/dev/zero"},
        ),
        refused_settings_file(
            "config_is_a_socket",
            "--config names a Unix socket",
            "settings.yaml cannot be read: not a regular file (a socket)",
            sockets=["settings.yaml"],
        ),
        usage(
            "data_settings_file_is_a_fifo",
            "the input root's rollout-shards.yaml is a FIFO (it used to be passed over)",
            f"rollout-shards.yaml cannot be read: {fifo}",
            [],
            fifos=["rollout-shards.yaml"],
        ),
        accepted(
            "manifest_is_a_fifo",
            "a built step whose manifest.json became a FIFO: counted as none, rebuilt",
            {f"step={STEP}.parquet": valid},
            [],
            prepare=[{"build": "out"}, {"fifo": f"out/step={STEP}/manifest.json"}],
        ),
        accepted(
            "manifest_is_a_device",
            "a built step whose manifest.json became a link to /dev/zero: counted as none",
            {f"step={STEP}.parquet": valid},
            [],
            prepare=[{"build": "out"}, {"link": [f"out/step={STEP}/manifest.json", "/dev/zero"]}],
        ),
        Case(
            "input_is_a_device",
            "step=8.parquet is a link to /dev/zero beside step 7: a note, step 7 built",
            {f"step={STEP}.parquet": valid},
            0,
            outcome={
                "counts": counts(8, 0, 0, 8),
                "ignored_columns": [],
                "skipped_files": [],
                "quarantine": [],
            },
            links={"step=8.parquet": "/dev/zero"},
            notes=["step=8.parquet"],
        ),
        # 6. metrics never replaces what is not a regular file.
        metrics_refused(
            "metrics_jsonl_is_a_fifo",
            "metrics --jsonl FIFO: a rename would put a plain file in its place",
            ["--jsonl", "{case}/metrics.jsonl"],
            "--jsonl {case}/metrics.jsonl is a FIFO, not a regular file: give a file to write, "
            "or - for stdout",
            case_fifos=["metrics.jsonl"],
        ),
        metrics_refused(
            "metrics_jsonl_is_a_device",
            "metrics --jsonl naming /dev/null through a link",
            ["--jsonl", "{case}/null.jsonl"],
            "--jsonl {case}/null.jsonl is a character device, not a regular file: give a "
            "file to write, or - for stdout",
            case_links={"null.jsonl": "/dev/null"},
        ),
        metrics_refused(
            "metrics_tensorboard_events_is_a_fifo",
            "metrics --tensorboard DIR whose event file is a FIFO",
            ["--tensorboard", "{case}/tb"],
            "--tensorboard {case}/tb: {case}/tb/events.out.tfevents.rollout-shards is a FIFO, "
            "not a regular file",
            case_fifos=["tb/events.out.tfevents.rollout-shards"],
        ),
        metrics_refused(
            "metrics_refused_before_writing_any",
            "metrics --tensorboard DIR --jsonl FIFO: nothing written, the event file neither",
            ["--tensorboard", "{case}/tb", "--jsonl", "{case}/metrics.jsonl"],
            "--jsonl {case}/metrics.jsonl is a FIFO, not a regular file: give a file to write, "
            "or - for stdout",
            case_fifos=["metrics.jsonl"],
        ),
        # 7. A stdout that is closed or goes away.
        *(
            Case(
                f"stdout_{name}",
                f"build ... {how}: steps 7 and 8 built and committed, step 9 refused, exit 1",
                three_steps(),
                1,
                stdout=stdout,
                built=[STEP, 8],
                lines=[STEP_9_LINE],
            )
            for name, how, stdout in [
                ("closed", ">&-", "closed"),
                ("reader_goes_away", "| head -1", "broken"),
            ]
        ),
        Case(
            "stdout_reader_goes_away_all_valid",
            "build ... | head -1 of two valid steps: both built, exit 0",
            {f"step={STEP}.parquet": valid, "step=8.parquet": parquet(at_step(8, rows))},
            0,
            stdout="broken",
            built=[STEP, 8],
        ),
        # 8. JSON Lines keys given twice, null as one of the values.
        json_invalid(
            "json_duplicate_key_then_null",
            'reward given twice on line 7, the second time null ("last wins" would drop it)',
            base(),
            "duplicate_key",
            [(6, 0)],
            "key reward must appear once in each JSON object, but it is given twice at file row 7",
        ).with_file(json_file, json_lines(rows, {6: last + ', "reward": null}'})),
        json_invalid(
            "json_duplicate_key_both_null",
            "raw_reward given twice on line 7, null both times",
            base(),
            "duplicate_key",
            [(6, 0)],
            "key raw_reward must appear once in each JSON object",
        ).with_file(
            json_file, json_lines(rows, {6: last + ', "raw_reward": null, "raw_reward": null}'})
        ),
        # 9. Interrupted while it waits for the step's lock: SIGINT ends it as SIGTERM does.
        *(
            Case(
                f"interrupted_by_{signal.lower()}",
                what,
                {f"step={STEP}.parquet": valid},
                status,
                signal=signal,
                built=[],
                folders=["out"],
            )
            for signal, status, what in [
                (
                    "SIGINT",
                    -2,
                    "SIGINT (Ctrl-C) during a build: ended by the signal, no traceback, nothing "
                    "written",
                ),
                ("SIGTERM", -15, "SIGTERM during a build, the same"),
            ]
        ),
        # 10. Settings files: unknown keys, miles' dashed spelling.
        refused_settings_file(
            "config_unknown_setting",
            "--config holding foo: 3",
            "settings.yaml: unknown setting foo",
            outside={"settings.yaml": b"foo: 3\n"},
        ),
        refused_settings_file(
            "config_dashed_setting",
            "--config spelling a setting as miles' flag, global-batch-size: 4",
            "settings.yaml: unknown setting global-batch-size (did you mean global_batch_size?)",
            outside={"settings.yaml": b"global-batch-size: 4\n"},
        ),
        Case(
            "validate_refuses_an_unknown_setting",
            "validate reads the settings file as build does: global-batch-size is refused",
            {f"step={STEP}.parquet": valid},
            2,
            command="validate",
            args=["--config", "{case}/settings.yaml"],
            outside={"settings.yaml": b"global-batch-size: 4\ndp_size: 2\n"},
            lines=[
                "config {case}/settings.yaml: unknown setting global-batch-size (did you mean "
                "global_batch_size?)"
            ],
        ),
    ]


def corrupted_pages(data: bytes) -> bytes:
    """A Parquet file whose first data page is overwritten: its footer still reads."""
    damaged = bytearray(data)
    for i in range(60, 140):
        damaged[i] ^= 0x5A
    return bytes(damaged)


def reader_cases() -> list[Case]:
    """Issue 45: inputs the readers in parts (a spill, Ray shares) once answered otherwise
    than the in-memory read; tests/core/test_readers_agree.py runs every case through each."""
    rows = base()
    too_big = [[11, 12, 13, 14, 15, 2**63 + 5], *[[11, 12, 13, 14, 15, 16]] * 7]
    tokens = pa.array(too_big, pa.list_(pa.uint64()))
    versions = pa.array(
        [[f"v{i}", f"v{i + 1}"] for i in range(8)], pa.list_(pa.dictionary(pa.int32(), pa.string()))
    )
    across_row_groups = io.BytesIO()
    table = arrow_table(rows, {"weight_versions": versions})
    pq.write_table(table, across_row_groups, row_group_size=4)
    empty = io.BytesIO()
    frame(at_step(6, rows)).clear().write_parquet(empty)
    return [
        quarantined(
            "uint64_token_above_int64",
            "a uint64 token above 2^63 on row 0 (and so its prompt group)",
            {f"step={STEP}.parquet": arrow_parquet(rows, {"tokens": tokens})},
            counts(8, 4, 0, 4),
            group_aside(0, "column_type", "column_type: column tokens must be List(Int32)"),
        ),
        Case(
            "zero_row_step_beside_a_valid_one",
            "step 6 holds no row, step 7 is valid: step 7 built, step 6 refused",
            {f"step={STEP}.parquet": parquet(rows), "step=6.parquet": empty.getvalue()},
            1,
            built=[STEP],
            lines=["step 6: rule not_enough_samples: not enough samples 0 for global_batch_size 4"],
        ),
        accepted(
            "dictionary_strings_in_lists_across_row_groups",
            "weight_versions as lists of dictionary-encoded strings, in two row groups",
            {f"step={STEP}.parquet": across_row_groups.getvalue()},
            [],
        ),
        unsupported(
            "corrupted_pages",
            "the first data page overwritten, the footer intact",
            corrupted_pages(parquet(rows)),
            "cannot read parquet: ",
            f"step={STEP}.parquet",
        ),
    ]


def cases() -> list[Case]:
    return [
        *column_cases(),
        *rule_cases(),
        *file_cases(),
        *accepted_cases(),
        *quarantine_cases(),
        *round_two_cases(),
        *yaml_config_cases(),
        *round_three_cases(),
        *dump_bound_cases(),
        *parity_cases(),
        *validate_json_cases(),
        *staging_cases(),
        *round_four_cases(),
        *reader_cases(),
    ]


def write_case(case: Case, root: Path) -> Path:
    folder = root / case.name
    (folder / "input").mkdir(parents=True, exist_ok=True)
    for base_folder, files in ((folder / "input", case.files), (folder, case.outside)):
        for name, data in files.items():
            path = base_folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for name, target in case.links.items():
        os.symlink(target, folder / "input" / name)
    for name in case.fifos:
        os.mkfifo(folder / "input" / name)
    for name in case.folders:
        (folder / name.replace("{host}", HOST)).mkdir(parents=True, exist_ok=True)
    for name, target in case.case_links.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, folder / name)
    for name in case.case_fifos:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(folder / name)
    for name in case.sockets:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(folder / name))
    spec = {
        "name": case.name,
        "what": case.what,
        "command": case.command,
        "args": [*ARGS, *case.args] if case.command in SETTINGS_COMMANDS else case.args,
        "exit": case.exit,
        "errors": case.errors,
        "outcome": case.outcome,
        "usage": case.usage,
        "notes": case.notes,
        "lines": case.lines,
        "report": case.report,
        "prepare": case.prepare,
        "stdout": case.stdout,
        "signal": case.signal,
        "built": case.built,
        "kept": case.kept,
        "gone": case.gone,
    }
    (folder / "case.json").write_text(json.dumps(spec, indent=2) + "\n")
    return folder


def generate(root: Path, select: Callable[[Case], bool] = lambda case: True) -> list[Path]:
    """Write every case under `root`; returns the case folders."""
    return [write_case(case, root) for case in cases() if select(case)]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/core/bad_inputs/generate.py OUT_DIR")
    written = generate(Path(sys.argv[1]))
    print(f"{len(written)} cases written under {sys.argv[1]}")
