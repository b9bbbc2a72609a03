"""The column table (`pipeline.columns.COLUMNS`) and everything derived from it: the
loader's keys (checked from its source: the loader imports nothing of the pipeline), the
contract's column tables, and a new optional column added by one row."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl

from pipeline import columns as c
from pipeline.schemas.rules import ROWS, TABLE
from tests.support.samples import REPO

LOADER = REPO / "loader" / "rollout_shards_loader" / "miles.py"
CONTRACT = REPO / "docs" / "contract.md"
# The loader reads these two apart from its per-row keys: `raw_reward` batch-wide (every
# rank's rows and the dropped ones), `total_lengths` for the rank's own rows.
BATCH_WIDE_KEYS = ("raw_reward", "total_lengths")


def loader_constants() -> dict[str, tuple[str, ...]]:
    """The loader's module-level tuples of names, read from its source (a tuple may spell
    out another's names, its own or those of `_rank.py`, the keys miles and slime share)."""
    found: dict[str, tuple[str, ...]] = {}
    for source in (LOADER.with_name("_rank.py"), LOADER):
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
                (target,) = node.targets
                assert isinstance(target, ast.Name)
                found[target.id] = _names(node.value, found)
    return found


def _names(value: ast.Tuple, known: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    names: list[str] = []
    for element in value.elts:
        if isinstance(element, ast.Starred):
            assert isinstance(element.value, ast.Name)
            names.extend(known[element.value.id])
        else:
            names.append(ast.literal_eval(element))
    return tuple(names)


def test_names_are_unique_on_each_side() -> None:
    read = [col.name for col in c.COLUMNS if col.input is not None]
    written = [col.written_as for col in c.COLUMNS if col.shard is not None]
    assert len(read) == len(set(read)) and len(written) == len(set(written))
    assert all(col.input is not None or col.shard is not None for col in c.COLUMNS)


def test_optional_columns_are_read_and_never_filled() -> None:
    for col in c.COLUMNS:
        if col.optional:
            assert col.input is not None and not col.filled, col.name
        if col.shard_name is not None:
            assert col.optional and col.shard is not None, col.name


def test_the_loader_hands_the_trainer_exactly_the_table_s_keys() -> None:
    loader = loader_constants()
    row_keys, optional, not_handed = loader["ROW_KEYS"], loader["OPTIONAL"], loader["NOT_HANDED"]
    source = LOADER.read_text()
    assert all(f'"{key}"' in source for key in BATCH_WIDE_KEYS)
    assert sorted({*row_keys, *BATCH_WIDE_KEYS}) == sorted(c.TRAINER_KEYS)
    # the loader reads each key from the rank-file column of that name, but miles' weight
    # versions in the span form (weight_version_spans)
    renamed = {name: key for name, key in c.TRAINER_KEYS.items() if name != key}
    assert renamed == {c.WEIGHT_VERSION_SPANS: c.WEIGHT_VERSIONS}
    assert f'KEY_OF = {{SPANS: "{c.WEIGHT_VERSIONS}"}}' in source
    assert f'SPANS = "{c.WEIGHT_VERSION_SPANS}"' in source
    assert set(optional) == {n for n in c.OPTIONAL_SHARD_COLUMNS if n in c.TRAINER_KEYS}
    assert sorted(not_handed) == sorted(set(c.DATASET_COLUMNS) - set(c.TRAINER_KEYS))


def test_the_rank_file_layout_is_the_contract_s() -> None:
    assert c.DATASET_COLUMNS == (
        *("batch_position", "train_step", "micro_batch", "tokens", "response_lengths"),
        *("total_lengths", "loss_masks", "rewards", "raw_reward", "truncated"),
        *("sample_indices", "rollout_ids", "rollout_mask_sums", "rollout_log_probs"),
        *("teacher_log_probs", "rollout_sampling_mask_ids", "rollout_sampling_mask_offsets"),
        *("weight_versions", "weight_version_spans", "round_number", "metadata"),
        *("step", "rank"),
    )
    assert c.OPTIONAL_SHARD_SOURCES["metadata"] == "train_metadata"
    assert c.REQUIRED_COLUMNS == ("index", "status", "tokens", "response_length", "reward")
    assert c.ALL_OR_NONE == (
        "rollout_log_probs",
        "teacher_log_probs",
        "rollout_sampling_mask_ids",
        "round_number",
        "train_metadata",
    )


def test_the_rules_check_the_declared_types() -> None:
    for name, rule in TABLE.columns.items():
        col = next(col for col in c.INPUT_COLUMNS if col.name == name)
        assert (rule.dtype, rule.nullable, rule.isin, rule.ge) == (
            col.input,
            col.optional,
            col.isin,
            col.ge,
        )
    assert set(TABLE.columns) == set(c.INPUT_SCHEMA)
    rule_names = {rule.name for rule in ROWS.rules}
    assert {f"{name}_all_or_none" for name in c.ALL_OR_NONE} <= rule_names


def contract_type(dtype: pl.DataType) -> str:
    """A type as the contract writes it: `int64`, `list<float32>`, `bool`,
    `struct<version: string, ...>`."""
    if isinstance(dtype, pl.List):
        return f"list<{contract_type(dtype.inner)}>"
    if isinstance(dtype, pl.Struct):
        fields = ", ".join(f"{f.name}: {contract_type(f.dtype)}" for f in dtype.fields)
        return f"struct<{fields}>"
    return "bool" if dtype == pl.Boolean else str(dtype).lower()


def contract_table(heading: str) -> dict[str, list[str]]:
    """The first table under `heading` in docs/contract.md: each named column's cells."""
    section = CONTRACT.read_text().partition(f"\n{heading}\n")[2]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = cells[1:]
    return rows


def test_the_contract_lists_every_input_column_with_its_type() -> None:
    table = contract_table("### Columns")
    assert list(table) == [col.name for col in c.INPUT_COLUMNS]
    for col in c.INPUT_COLUMNS:
        assert col.input is not None
        kind, null, _ = table[col.name]
        # the type, before any comma outside its brackets ("string, a JSON object")
        assert re.split(r",(?![^<]*>)", kind)[0] == contract_type(col.input), col.name
        assert null == ("yes" if col.optional else "no"), col.name


def file_type(arrow_type: object) -> str:
    """An Arrow type as the contract writes it: `large_list<int32>`, `float64`."""
    text = str(arrow_type).replace("element: ", "").replace("item: ", "")
    return re.sub(r"\bdouble\b", "float64", re.sub(r"\bfloat\b", "float32", text))


def test_the_contract_lists_every_shard_column_with_the_type_its_files_hold(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    from pipeline.cli import main

    assert main(["build", str(REPO / "data" / "rollouts"), "--out", str(tmp_path)]) == 0
    held = pq.read_schema(tmp_path / "step=1" / "rank=0.parquet")
    table = contract_table("### Shard columns")
    assert sorted(table) == sorted(c.DATASET_COLUMNS) == sorted(held.names)
    for name in c.DATASET_SCHEMA:
        kind, meaning = table[name]
        assert kind == file_type(held.field(name).type), name
        assert meaning.startswith("optional") == (name in c.OPTIONAL_SHARD_COLUMNS), name


# A new optional column as one row of the table, and a step through the whole build.
NEW_COLUMN = """\
    Column(
        "reasoning_tokens",
        "reasoning tokens of the response; null when the step has none",
        input=pl.Int64(),
        shard=pl.Int64(),
        optional=True,
        trainer_key="reasoning_tokens",
    ),
"""
BUILD_WITH_A_NEW_COLUMN = """
import json, sys, types
from pathlib import Path

import pipeline

source = Path("pipeline/columns.py").read_text()
marker = "    Column(PROMPT,"
assert source.count(marker) == 1
module = types.ModuleType("pipeline.columns")
module.__file__ = "pipeline/columns.py"
sys.modules["pipeline.columns"] = pipeline.columns = module
exec(compile(source.replace(marker, sys.argv[2] + marker), "columns.py", "exec"), vars(module))

import polars as pl
from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from pipeline.step.write import dataset_card
from tests.support.samples import sample, write_step

out = Path(sys.argv[1])
rows = [sample(i, reward=float(i % 2), reasoning_tokens=i) for i in range(8)]
write_step(out / "in", rows, step=1)
write_step(out / "in", [sample(i, reward=float(i % 2)) for i in range(8)], step=2)
bad = [sample(i, reward=float(i % 2), reasoning_tokens=i if i else None) for i in range(8)]
write_step(out / "bad", bad, step=3)
for step, sources in group_steps(find_sources([out / "in"])).items():
    build_step(step, sources, Settings(global_batch_size=4), out / "shards")
((step, sources),) = group_steps(find_sources([out / "bad"])).items()
try:
    build_step(step, sources, Settings(global_batch_size=4), out / "shards")
    rule = None
except StepError as error:
    rule = error.violations[0].rule
frames = {s: pl.read_parquet(out / f"shards/step={s}/rank=0.parquet") for s in (1, 2)}
print(json.dumps({
    "columns": frames[1].columns,
    "dtype": str(frames[1].schema["reasoning_tokens"]),
    "values": frames[1].get_column("reasoning_tokens").to_list(),
    "absent": frames[2].get_column("reasoning_tokens").to_list(),
    "present": [
        json.loads((out / f"shards/step={s}/manifest.json").read_text())["present_columns"]
        for s in (1, 2)
    ],
    "rule": rule,
    "card": "reasoning_tokens" in dataset_card("0" * 16),
}))
"""


def test_a_new_optional_column_takes_one_row(tmp_path: Path) -> None:
    """The build with one row added to COLUMNS (in a fresh interpreter, the table patched
    before anything reads it): the column is typed on read, checked all-or-none, written
    to every rank file of every step (null where a step lacks it), listed in
    `present_columns` and in the dataset card."""
    result = subprocess.run(
        [sys.executable, "-c", BUILD_WITH_A_NEW_COLUMN, str(tmp_path), NEW_COLUMN],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["columns"][-3:] == ["reasoning_tokens", "step", "rank"]
    assert found["dtype"] == "Int64"
    assert found["values"] == list(range(8))
    assert found["absent"] == [None] * 8
    assert found["present"] == [["reasoning_tokens"], []]
    assert found["rule"] == "reasoning_tokens_all_or_none"
    assert found["card"] is True
