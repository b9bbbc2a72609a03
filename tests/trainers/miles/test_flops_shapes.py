"""balance_by_flops over every model shape miles' FLOPs read, against miles' own code on
CPU (tests/support/miles.py): the rows miles' rollout side keeps
(`postprocess_rollout_data`: trimming, the dynamic global batch size) and its
`build_dp_schedule` on them, against the miles profile's plan and the rank files a build
writes (each rank's rows in order, their train step and micro-batch; the rollout and
micro-batch counts). Shapes: shared experts, integer and list layer frequencies above 1,
MLA, GQA; layouts: vpp with micro-batch groups, cp, dp, dynamic global batch sizes,
compact batches, partial steps, balanced ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import strategies as st

from pipeline import columns as c
from pipeline import trainers
from pipeline.errors import StepError
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import load_settings
from pipeline.step.readers.memory import load_samples
from pipeline.transforms.samples import light_frame
from tests.support import miles as ms
from tests.support.miles import MEGATRON_PARSER, megatron_args
from tests.support.samples import build, sample, write_step
from tests.support.strategies import by_flops, derandomized, rollout_keys

SHAPE_FLAGS = (*MEGATRON_PARSER, "num_layers", "hidden_size", "ffn_hidden_size")
SHAPE_FLAGS += ("num_attention_heads", "vocab_size")


@pytest.fixture(scope="module")
def miles(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """miles' rollout-side modules, kept after their import context closes."""
    return ms.kept_modules(tmp_path_factory, dp_schedule="miles.utils.dp_schedule")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One input root every generated case writes its step to, in turn."""
    return tmp_path_factory.mktemp("cases")


def rows_of(keys: list[int], lengths: list[int], compact: bool) -> list[dict[str, Any]]:
    """Rows whose rollout is `keys[i]` (when compact, the leaves of a rollout of several
    share its id as v2 leaves do), each
    `lengths[i]` tokens long."""
    seen: dict[int, int] = {}
    rows = []
    for key, length in zip(keys, lengths, strict=True):
        leaf = seen[key] = seen.get(key, -1) + 1
        # the contract's rule: a rollout id on the leaves of v2 multi-leaf trajectories only
        multi_leaf = compact and keys.count(key) > 1
        extra = {"rollout_id": key, "session_version": "v2"} if multi_leaf else {}
        # a prompt group per rollout, so that no trim cuts one (SEMANTICS 5.4)
        rows.append(sample(key, leaf, group_index=key, response_length=length - 2, **extra))
    return rows


def miles_schedule(miles: Any, rows: list[dict[str, Any]], values: dict[str, Any]) -> Any:
    """What miles' rollout side does with the rows: keep them (trim, dynamic global batch
    size), then `build_dp_schedule` when it schedules there; None when it would not (fewer
    rollouts than the global batch), "refused" when it raises."""
    model = {name: values[name] for name in SHAPE_FLAGS if values.get(name) is not None}
    args = megatron_args(
        model,
        global_batch_size=values["global_batch_size"],
        use_dynamic_global_batch_size=values.get("use_dynamic_global_batch_size", False),
        disable_rollout_trim_samples=False,
        multi_lora=False,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=values["max_tokens_per_gpu"],
        balance_by_flops=True,
        balance_data=values.get("balance_data", False),
        allow_partial_train_step=values.get("allow_partial_train_step", False),
        micro_batch_size=1,
    )
    config = ms.train_parallel_config(values)
    try:
        kept, metadata = miles.postprocess.postprocess_rollout_data(
            args, ms.samples(miles, rows), config
        )
        size = metadata.get("dynamic_global_batch_size", args.global_batch_size)
        keys = [s.rollout_id if s.rollout_id is not None else s.index for s in kept]
        if len(set(keys)) < size:
            return None
        result = miles.dp_schedule.build_dp_schedule(
            args,
            config,
            [len(s.tokens) for s in kept],
            global_batch_size=size,
            rollout_indices=keys,
        )
    except (AssertionError, ValueError):
        return "refused"
    return ms.miles_layout(result, values["dp_size"])


def our_schedule(rows: list[dict[str, Any]], values: dict[str, Any], root: Path) -> Any:
    """The miles profile's plan of the rows read back from a step written under `root`
    (trim, rewards, layout), as `miles_schedule`."""
    chosen = load_settings(**values)
    write_step(root, rows, step=1)
    ((step, sources),) = group_steps(find_sources([root])).items()
    frame = load_samples(step, sources, chosen).frame
    light = light_frame(frame, None, step)
    try:
        plan = trainers.profile("miles").plan(light.lazy(), frame.schema, frame.height, chosen, 1)
    except StepError:
        return "refused"
    layout = plan.layout
    assert layout.micro_batch is not None, "scheduled on the rollout side"
    frame = pl.DataFrame(
        {
            "order": layout.order,
            "rank": layout.rank,
            "step": layout.train_step,
            "micro": layout.micro_batch,
        }
    )
    ranks = []
    for r in range(chosen.dp_size):
        mine = frame.filter(pl.col("rank") == r)
        ranks.append(tuple(mine.get_column(name).to_list() for name in ("order", "step", "micro")))
    return {
        "ranks": ranks,
        "num_rollouts": layout.num_rollouts,
        "num_microbatches": layout.num_microbatches,
    }


@st.composite
def models(draw: st.DrawFn) -> dict[str, Any]:
    """A model shape as a run's flags give it: dense or MoE (routed top-k, an expert width
    or none, shared experts, every N-th layer or a per-layer list), GQA, MLA; a flag left
    out takes Megatron's parser default on both sides."""
    layers = draw(st.integers(1, 8))
    heads = draw(st.sampled_from([2, 4, 8]))
    model: dict[str, Any] = {
        "num_layers": layers,
        "hidden_size": heads * draw(st.sampled_from([8, 16, 32])),
        "ffn_hidden_size": draw(st.integers(8, 512)),
        "num_attention_heads": heads,
        "vocab_size": draw(st.integers(10, 5000)),
    }
    if draw(st.booleans()):
        model["num_query_groups"] = draw(st.sampled_from([1, 2]))
        model["kv_channels"] = draw(st.sampled_from([8, 16]))
    if draw(st.booleans()):
        model["num_experts"] = draw(st.sampled_from([2, 8, 128]))
        model["moe_router_topk"] = draw(st.none() | st.integers(1, 8))
        model["moe_ffn_hidden_size"] = draw(st.none() | st.integers(4, 256))
        model["moe_shared_expert_intermediate_size"] = draw(
            st.none() | st.integers(0, 2048) | st.just(1024)
        )
        pattern = draw(st.sampled_from(["none", "every", "list"]))
        if pattern == "every":
            model["moe_layer_freq"] = draw(st.integers(1, 4))
        elif pattern == "list":
            model["moe_layer_freq"] = draw(
                st.lists(st.integers(0, 2), min_size=layers, max_size=layers)
            )
    if draw(st.booleans()):
        model["kv_lora_rank"] = draw(st.integers(4, 32))
        model["q_lora_rank"] = draw(st.none() | st.integers(4, 32))
        model["qk_head_dim"] = draw(st.integers(0, 16))
        model["qk_pos_emb_head_dim"] = draw(st.integers(0, 8))
        model["v_head_dim"] = draw(st.integers(0, 16))
    return {name: value for name, value in model.items() if value is not None}


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    n_rollouts, compact, keys = draw(rollout_keys(3))
    top = draw(st.sampled_from([300, 6000]))
    lengths = draw(st.lists(st.integers(3, top), min_size=len(keys), max_size=len(keys)))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    vpp = draw(st.sampled_from([None, 1, 2, 3]))
    values: dict[str, Any] = {
        **draw(models()),
        "global_batch_size": dp * draw(st.integers(1, max(1, n_rollouts // dp))),
        "dp_size": dp,
        "cp_size": draw(st.integers(1, 4)),
        **by_flops(draw, vpp, top),
        # the dynamic global batch size trims row counts: never on a compact batch
        "use_dynamic_global_batch_size": not compact and draw(st.booleans()),
        "allow_partial_train_step": draw(st.booleans()),
        "balance_data": draw(st.booleans()),
    }
    return rows_of(keys, lengths, compact), values


@derandomized(200, HealthCheck.filter_too_much)
@given(batches())
def test_every_shape_and_layout_is_miles_own(
    miles: Any, scratch: Path, case: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    rows, values = case
    expected = miles_schedule(miles, rows, values)
    assume(expected is not None)  # miles would split on the trainer: no schedule to compare
    assert our_schedule(rows, values, scratch) == expected


# The four shapes of issue 46, with the flags as a run gives them (the rest as Megatron's
# parser leaves them): rank files against miles' rollout side and schedule.
BASE = {
    "num_layers": 8,
    "hidden_size": 1024,
    "ffn_hidden_size": 4096,
    "num_attention_heads": 16,
    "num_query_groups": 4,
    "kv_channels": 64,
    "vocab_size": 32000,
}
BY_FLOPS = {"use_dynamic_batch_size": True, "balance_by_flops": True, "cp_size": 1}
ISSUE_SHAPES: dict[str, dict[str, Any]] = {
    "moe_pattern_list_shared_expert_dp2": {
        **BASE,
        **BY_FLOPS,
        "num_experts": 64,
        "moe_ffn_hidden_size": 512,
        "moe_layer_freq": [0, 1, 1, 1, 0, 1, 1, 1],
        "moe_shared_expert_intermediate_size": 1024,
        "dp_size": 2,
        "global_batch_size": 8,
        "max_tokens_per_gpu": 3000,
    },
    "moe_every_2nd_layer_dp8_cp2": {
        **BASE,
        **BY_FLOPS,
        "num_experts": 64,
        "moe_ffn_hidden_size": 512,
        "moe_layer_freq": 2,
        "dp_size": 8,
        "cp_size": 2,
        "global_batch_size": 16,
        "max_tokens_per_gpu": 1500,
    },
    "dense_vpp2_microbatch_groups_dp4": {
        **BASE,
        **BY_FLOPS,
        "vpp_size": 2,
        "microbatch_group_size_per_vp_stage": 2,
        "dp_size": 4,
        "global_batch_size": 16,
        "max_tokens_per_gpu": 2500,
    },
    "dynamic_global_batch_moe_128x8_dp4": {
        **BASE,
        **BY_FLOPS,
        "num_experts": 128,
        "moe_router_topk": 8,
        "use_dynamic_global_batch_size": True,
        "dp_size": 4,
        "global_batch_size": 8,
        "max_tokens_per_gpu": 2000,
    },
}


def _issue_rows(n: int) -> list[dict[str, Any]]:
    lengths = [(97 * i * i + 31 * i) % 1900 + 3 for i in range(n)]
    return rows_of(list(range(n)), lengths, compact=False)


@pytest.mark.parametrize("name", sorted(ISSUE_SHAPES))
def test_issue_shapes_rank_files_are_miles_schedule(miles: Any, name: str, tmp_path: Path) -> None:
    values = ISSUE_SHAPES[name]
    rows = _issue_rows(37)
    expected = miles_schedule(miles, rows, values)
    assert isinstance(expected, dict), expected
    assert our_schedule(rows, values, tmp_path / "in") == expected
    write_step(tmp_path / "in", rows, step=1)
    build(tmp_path / "in", tmp_path / "out", **values)
    folder = tmp_path / "out" / "step=1"
    for rank, (order, steps, micro) in enumerate(expected["ranks"]):
        shard = pl.read_parquet(folder / f"rank={rank}.parquet")
        assert shard.get_column(c.BATCH_POSITION).to_list() == order
        assert shard.get_column(c.TRAIN_STEP).to_list() == steps
        assert shard.get_column(c.MICRO_BATCH).to_list() == micro
