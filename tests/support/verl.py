"""verl 0.9.1's own trainer-side code on CPU, as a test fixture: the DataProto its
`RayPPOTrainer.fit` (the legacy trainer, `trainer.use_v1=false`) hands each data-parallel
rank for a list of rollout rows.

verl comes from the package registry (`pip install --no-deps verl==0.9.1`, the project's
`verl` extra; see docs/verl.md). Its modules are imported as they are; the third-party
packages they import that are not installed (transformers, Megatron, flash-attn,
...) resolve to permissive stand-ins, as tests/support/miles.py does for miles.
torch, numpy, tensordict, Ray, omegaconf, hydra, pydantic and TransferQueue are the real ones.

The one stand-in the data path touches is the tokenizer: the agent loop pads with
`tokenizer.pad`, and `MemoryTokenizer` does what transformers' `PreTrainedTokenizerBase.pad`
does for one unbatched example with `padding="max_length"` (no truncation).

The path, in `fit`'s order: the agent loop's `_agent_loop_postprocess` per sample and
`_postprocess` over the batch (`AgentLoopWorker`), `DataProto.repeat(n, interleave=True)`
of the prompts' batch and `union`, `RayPPOTrainer._balance_batch` on a minimal trainer,
`global_token_num`, `extract_reward`, `token_level_scores`/`token_level_rewards` (no KL in
the reward), `compute_advantage` (GRPO), then `DataProto.chunk(dp_size)`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.peer_source import StubLoader, StubModule

VERSION = "0.9.1"
INSTALL = f"pip install --no-deps verl=={VERSION} (the project's `verl` extra; docs/verl.md)"
MODULES = {
    "protocol": "verl.protocol",
    "ray_trainer": "verl.trainer.ppo.ray_trainer",
    "core_algos": "verl.trainer.ppo.core_algos",
    "reward": "verl.trainer.ppo.reward",
    "agent_loop": "verl.experimental.agent_loop.agent_loop",
    "algorithm": "verl.trainer.config.algorithm",
    # the V1 trainer (trainer.use_v1=true) and what it reaches TransferQueue through
    "agent_loop_tq": "verl.trainer.ppo.v1.agent_loop_tq",
    "trainer_sync": "verl.trainer.ppo.v1.trainer_sync",
    "padding": "verl.trainer.ppo.padding_utils",
    "tq_bridge": "verl.utils.transferqueue_utils",
    "dispatch": "verl.single_controller.base.decorator",
    "tensordict_utils": "verl.utils.tensordict_utils",
}


class _VersionedStub(StubModule):
    # verl compares some packages' versions at import (megatron.core)
    __version__ = "0.0.0"


class _Loader(StubLoader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _VersionedStub(spec.name)
        module.__path__ = []
        return module


def _imported_by_verl() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != __name__:
            return name == "verl" or name.startswith("verl.")
        frame = frame.f_back
    return False


class _MissingFinder(importlib.abc.MetaPathFinder):
    """Stands in for the packages verl imports that are not installed."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        top = fullname.partition(".")[0]
        if top == "verl" or top in sys.stdlib_module_names:
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if not (isinstance(parent, _VersionedStub) or top in self.names):
            if not _imported_by_verl():
                return None
            if importlib.machinery.PathFinder.find_spec(top) is not None:
                return None  # installed: the real package
        self.names.add(top)
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


@functools.cache
def verl_modules() -> types.SimpleNamespace:
    """verl 0.9.1's modules, imported once per session. Stand-ins are removed from
    `sys.modules` afterwards (verl's modules keep what they bound), so nothing else in
    the session sees them."""
    try:
        installed = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != VERSION:
        raise RuntimeError(f"verl {VERSION} is needed, found {installed}: {INSTALL}")
    finder = _MissingFinder()
    sys.meta_path.insert(0, finder)
    try:
        loaded = {key: importlib.import_module(name) for key, name in MODULES.items()}
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _VersionedStub)]:
            del sys.modules[name]
    return types.SimpleNamespace(**loaded, stubbed=sorted(finder.names))


class MemoryTokenizer:
    """transformers' tokenizer `pad` for one unbatched example, `padding="max_length"`:
    the ids padded with `pad_token_id` on `padding_side` up to `max_length` (never cut),
    the attention mask 1 on ids and 0 on padding, as int64 tensors (`return_tensors="pt"`)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.padding_side = "right"

    def pad(
        self,
        encoded: dict[str, list[int]],
        padding: str,
        max_length: int,
        return_tensors: str,
        return_attention_mask: bool,
    ) -> dict[str, Any]:
        import torch

        assert padding == "max_length" and return_tensors == "pt"
        ids = list(encoded["input_ids"])
        fill = max(max_length - len(ids), 0)
        pads, mask = [self.pad_token_id] * fill, [1] * len(ids)
        if self.padding_side == "left":
            ids, mask = pads + ids, [0] * fill + mask
        else:
            ids, mask = ids + pads, mask + [0] * fill
        out = {"input_ids": torch.tensor(ids)}
        if return_attention_mask:
            out["attention_mask"] = torch.tensor(mask)
        return out


def agent_loop_worker(m: types.SimpleNamespace, settings: dict[str, Any]) -> Any:
    """An `AgentLoopWorker` as its `__init__` leaves it for a text-only model without
    reward-loop workers or distillation: the attributes the post-processing reads."""
    worker = object.__new__(m.agent_loop.AgentLoopWorker)
    worker.tokenizer = MemoryTokenizer(settings["pad_token_id"])
    worker.processor = None
    worker.rollout_config = types.SimpleNamespace(
        prompt_length=settings["max_prompt_length"],
        response_length=settings["max_response_length"],
    )
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    return worker


def ppo_trainer(m: types.SimpleNamespace, dp_size: int) -> Any:
    """A `RayPPOTrainer` with what `_balance_batch` reads: the actor's dispatch info
    (one entry per rank, as `_query_dispatch_info` returns it)."""
    trainer = object.__new__(m.ray_trainer.RayPPOTrainer)
    trainer.actor_rollout_wg = types.SimpleNamespace(_dispatch_info={"actor": list(range(dp_size))})
    return trainer


def rollout_batch(m: types.SimpleNamespace, rows: list[dict[str, Any]], settings: dict[str, Any]):
    """The agent loop's output for `rows`: each row's `AgentLoopOutput` (prompt = `tokens`
    without the last `response_length`, the loss mask as response mask, the reward as the
    score, log probs when given) through `_agent_loop_postprocess`, then `_postprocess`."""
    worker = agent_loop_worker(m, settings)
    outputs = []
    for row in rows:
        tokens, length = list(row["tokens"]), row["response_length"]
        cut = len(tokens) - length
        mask = row.get("loss_mask")
        output = m.agent_loop.AgentLoopOutput(
            prompt_ids=tokens[:cut],
            response_ids=tokens[cut:],
            response_mask=[1] * length if mask is None else list(mask),
            response_logprobs=None
            if row.get("rollout_log_probs") is None
            else [float(x) for x in row["rollout_log_probs"]],
            reward_score=float(row["reward"]),
            num_turns=2,
            metrics=m.agent_loop.AgentLoopMetrics(),
        )
        post = worker._agent_loop_postprocess(output, False, raw_prompt=[])
        outputs.append(asyncio.run(post))
    return worker._postprocess(outputs, input_non_tensor_batch=None, validate=False)


def trainer_ranks(rows: list[dict[str, Any]], settings: dict[str, Any]) -> list[Any]:
    """The DataProto `fit` hands each data-parallel rank for one step of `rows` (prompt
    groups of `rollout_n` contiguous rows, `uid` = str(group_index)), with its
    `non_tensor_batch` kept to `uid` and its `meta_info` to `global_token_num`: what the
    actor's update reads of the rollout."""
    import numpy as np
    import torch

    m = verl_modules()
    n, dp = settings["rollout_n"], settings["dp_size"]
    uids = [str(row["group_index"]) for row in rows[::n]]
    # the dataloader's batch: one row per prompt, with RLHFDataset's dummy tensor
    batch = m.protocol.DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros((len(uids), 1), dtype=torch.uint8)},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    batch = batch.repeat(repeat_times=n, interleave=True)
    batch = batch.union(rollout_batch(m, rows, settings))
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = m.ray_trainer.compute_response_mask(batch)
    if settings["balance_batch"]:
        ppo_trainer(m, dp)._balance_batch(batch, metrics={})
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, _ = m.reward.extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = m.ray_trainer.compute_advantage(
        batch,
        adv_estimator=m.core_algos.AdvantageEstimator.GRPO,
        gamma=1.0,
        lam=1.0,
        num_repeat=n,
        norm_adv_by_std_in_grpo=settings["norm_adv_by_std_in_grpo"],
        config=m.algorithm.AlgoConfig(),
    )
    batch.non_tensor_batch = {"uid": batch.non_tensor_batch["uid"]}
    batch.meta_info = {"global_token_num": batch.meta_info["global_token_num"]}
    return batch.chunk(dp)


def case_rows(
    *,
    groups: int,
    n: int,
    seed: int,
    max_prompt: int = 6,
    max_response: int = 7,
    log_probs: bool = True,
    full: bool = False,
) -> list[dict[str, Any]]:
    """Rows for one step in the input contract's shape: `groups` prompt groups of `n`
    contiguous rows with group ids out of order; prompt and response lengths uneven (or,
    with `full`, every prompt and response at its maximum), a third of the responses
    truncated at the maximum, loss masks with tool-token zeros, one group with equal
    rewards, rewards with float32 rounding and negative values."""
    import random

    rng = random.Random(seed)
    ids = rng.sample(range(1000, 1000 + 10 * groups), groups)
    rows = []
    for g, group in enumerate(ids):
        equal = g == 1
        for _ in range(n):
            prompt = max_prompt if full else rng.randint(0, max_prompt)
            truncated = full or rng.random() < 0.33
            length = max_response if truncated else rng.randint(0, max_response)
            mask = [1] * length
            if length > 2 and rng.random() < 0.6:  # a tool call's tokens
                start = rng.randint(1, length - 1)
                for j in range(start, min(length, start + rng.randint(1, 3))):
                    mask[j] = 0
            row: dict[str, Any] = {
                "group_index": group,
                "index": len(rows),
                "status": "truncated" if truncated else "completed",
                "tokens": [rng.randint(1, 50_000) for _ in range(prompt + length)],
                "response_length": length,
                "loss_mask": mask if rng.random() < 0.8 else None,
                "reward": 1.0 if equal else rng.choice([0.0, 1.0, -0.5, 0.1, rng.uniform(-3, 3)]),
            }
            if log_probs:
                row["rollout_log_probs"] = [-rng.random() * 4 for _ in range(length)]
            rows.append(row)
    return rows


# --- verl's own dumps (`DataProto.save_to_disk`, the rollout skip manager's layout) -----

# a step of three prompt groups of four rows, on two ranks
SMALL_STEP: dict[str, Any] = {
    "trainer": "verl",
    "dp_size": 2,
    "rollout_n": 4,
    "train_batch_size": 3,
    "max_prompt_length": 6,
    "max_response_length": 7,
    "pad_token_id": 0,
}
DUMP_SETTINGS: dict[str, Any] = {
    **SMALL_STEP,
    "pad_token_id": 151643,
    "balance_batch": True,
    "norm_adv_by_std_in_grpo": True,
}


def dump_rows(log_probs: bool = True) -> list[dict[str, Any]]:
    """A step as verl generates it: each group's rows share their prompt; groups numbered in
    order of appearance (a dump's uids become that order); float32 rewards."""
    rows = case_rows(groups=3, n=4, seed=11, log_probs=log_probs)
    for g in range(3):
        first = rows[4 * g]
        prompt = first["tokens"][: len(first["tokens"]) - first["response_length"]]
        for row in rows[4 * g : 4 * g + 4]:
            row["group_index"] = g
            row["tokens"] = prompt + row["tokens"][len(row["tokens"]) - row["response_length"] :]
            row["reward"] = float(np.float32(row["reward"]))
    return rows


def write_dump(
    folder: Path, rows: list[dict[str, Any]], step: int, uid: bool, edit: Any = None
) -> Path:
    """verl's agent-loop output for `rows`, saved by `DataProto.save_to_disk` as the rollout
    skip manager saves it."""
    gen = rollout_batch(verl_modules(), rows, DUMP_SETTINGS)
    if uid:  # the trainer's uids ride along without a reward loop
        uids = [f"uuid-{row['group_index']}-x" for row in rows]
        gen.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    if edit is not None:  # a test's change to the DataProto before it is saved
        gen = edit(gen) or gen
    step_dir = folder / "GBS3_N4_in6_out7" / str(step)
    step_dir.mkdir(parents=True)
    gen.save_to_disk(step_dir / "gen_batch.dp")
    (step_dir / "meta.json").write_text(json.dumps({"global_steps": step}))
    return folder / "GBS3_N4_in6_out7"


def assert_same(got: Any, want: Any) -> None:
    """Two verl DataProtos alike: every batch tensor by dtype, shape and bytes; the uids."""
    import torch

    assert list(got.batch.keys()) == list(want.batch.keys())
    for key in want.batch.keys():
        a, b = got.batch[key], want.batch[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key
        assert a.numpy().tobytes() == b.contiguous().numpy().tobytes(), key  # -0.0 too
    assert list(got.non_tensor_batch) == ["uid"]
    uid = got.non_tensor_batch["uid"]
    assert uid.dtype == object and all(type(u) is str for u in uid)
    assert uid.tolist() == want.non_tensor_batch["uid"].tolist()
    assert got.meta_info == {"global_token_num": want.meta_info["global_token_num"]}
