"""verl 0.9.1's V1 trainer fed by `rollout_shards_loader.verl_v1.StepAgentLoopManager`, on
CPU with a real TransferQueue on a local Ray (127.0.0.1): for a step built with
`--trainer verl --verl-target v1`, what each data-parallel rank receives after V1's own
`ReplayBuffer.sample`, `_balance_batch` (pad rows included), `_compute_old_log_prob`
(bypass mode: the rollout log probs, no model), `_compute_advantage` and the worker
dispatch (`KVBatchMeta.chunk`, then the worker's `tqbridge` read) equals, bit for bit,
what the same V1 code computes when verl's own agent loop worker
(`AgentLoopWorkerTQ._agent_loop_postprocess`) puts the same rows, scored, in the step's
order. The rows reach TransferQueue group after group in the step's order, every run.

verl's config is its own `ppo_trainer.yaml` (hydra compose) with the test's overrides; the
trainer is a `PPOTrainerSync` holding what those methods read (no worker groups, no
inference engine): the actor's dispatch info and the tokenizer's eos id.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.samples import build, write_step
from tests.support.verl import case_rows, verl_modules

HOOK = "rollout_shards_loader.verl_v1.StepAgentLoopManager"
EOS = 151645
RAYLET_WAIT_S = 300.0
CASES = [
    # dp, n, groups, ppo_mini_batch_size: the batch padded to lcm(dp, mini * n) when short
    {"dp": 2, "n": 4, "groups": 3, "mini": 2, "std": True},  # 12 rows + 4 pad rows
    {"dp": 4, "n": 5, "groups": 2, "mini": 1, "std": False},  # 10 rows + 10 pad rows
    {"dp": 1, "n": 1, "groups": 3, "mini": 3, "std": True},  # no padding, groups of one
    {"dp": 2, "n": 16, "groups": 2, "mini": 2, "std": True},  # torch's long-group sums
]


def _listening() -> set[tuple[str, int, str]]:
    """The TCP ports this process and its descendants (Ray's and TransferQueue's) listen on."""
    import psutil

    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    return {
        (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in ours
    }


def _loopback(ip: str) -> bool:
    """127.0.0.1, also as an IPv6 socket's IPv4-mapped address (::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address) == "127.0.0.1"


@pytest.fixture(scope="module")
def tq() -> Iterator[Any]:
    """A local Ray on 127.0.0.1 with TransferQueue started in it (two storage units)."""
    import ray
    import transfer_queue

    verl_modules()
    # Ray gives a local raylet 30 s to register, too few on a loaded 2-core machine: its
    # look-up of the node waits longer here (the start itself is Ray's own)
    lookup = ray._private.services.get_node

    def patient_lookup(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + RAYLET_WAIT_S
        while True:
            try:
                return lookup(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray._private.services, "get_node", patient_lookup)
        # one machine: Ray keeps its processes, and the actors' TransferQueue sockets, on
        # 127.0.0.1 (the driver read the variable when Ray was imported; its processes
        # read it from the environment they start with)
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        # a cluster of its own: another Ray head of this machine would be joined otherwise
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            num_cpus=4,
            logging_level="ERROR",
            log_to_driver=False,
        )
    try:
        transfer_queue.init()
        try:
            opened = _listening()
            assert opened and all(_loopback(ip) for ip, _, _ in opened), sorted(opened)
            yield transfer_queue
        finally:
            transfer_queue.close()
    finally:
        ray.shutdown()


def verl_config(root: Path, case: dict[str, Any]) -> Any:
    """verl's own `ppo_trainer.yaml` (V1 by default) with the step's sizes and the hook."""
    import verl
    from hydra import compose, initialize_config_dir

    folder = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.rollout.n={case['n']}",
                f"data.train_batch_size={case['groups']}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={case['mini']}",
                "algorithm.adv_estimator=grpo",
                f"algorithm.norm_adv_by_std_in_grpo={case['std']}",
                "algorithm.rollout_correction.bypass_mode=True",
                f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={HOOK}",
                "trainer.val_before_train=False",
                f"+rollout_shards.root={root}",
            ],
        )
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == "sync"
    return config


def v1_rows(case: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """Rows for one step; V1 cannot hold an empty response, so each has one token."""
    rows = case_rows(groups=case["groups"], n=case["n"], seed=seed, max_prompt=9, max_response=9)
    for row in rows:
        if row["response_length"] == 0:
            row["tokens"] = [*row["tokens"], 17]
            row["response_length"] = 1
            row["loss_mask"] = None if row["loss_mask"] is None else [1]
            row["rollout_log_probs"] = [-0.25]
    return rows


def prompts(m: Any, groups: int, step: int) -> Any:
    """The dataloader's batch as V1's `_next_train_batch` hands it to the manager: a uid
    per prompt and the dataset's fields, `global_steps` beside them."""
    uids = [str(uuid.UUID(int=7 + i)) for i in range(groups)]
    batch = m.tensordict_utils.get_tensordict(
        {
            "uid": np.array(uids, dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": f"q{i}"}] for i in range(groups)]),
            "data_source": np.array(["gsm8k"] * groups, dtype=object),
            "index": np.arange(groups),
        }
    )
    m.tensordict_utils.assign_non_tensor_data(batch, "global_steps", step)
    return batch


def submit(tq: Any, batch: Any, step: int) -> list[str]:
    """`_submit_batch_to_rollout` (sync mode): each prompt registered as pending."""
    uids = list(batch["uid"])
    tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    return uids


def verl_agent_loop(m: Any, tq: Any, batch: Any, rows: list[dict[str, Any]], n: int) -> None:
    """verl's own agent loop worker putting `rows` in the step's order: each row a
    single-turn `AgentLoopOutput` with the reward loop's score, through
    `AgentLoopWorkerTQ._agent_loop_postprocess`, and each prompt's status as `_run_prompt`
    sets it."""
    from rollout_shards_loader.verl_v1 import _prompt_kwargs

    worker = object.__new__(m.agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.processor = None
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    for g, uid in enumerate(batch["uid"]):
        kwargs = _prompt_kwargs(batch, g)
        tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
        for session in range(n):
            row = rows[g * n + session]
            cut = len(row["tokens"]) - row["response_length"]
            output = m.agent_loop.AgentLoopOutput(
                prompt_ids=row["tokens"][:cut],
                response_ids=row["tokens"][cut:],
                response_mask=row["loss_mask"] or [1] * row["response_length"],
                response_logprobs=[float(np.float32(x)) for x in row["rollout_log_probs"]],
                num_turns=2,
                metrics={},
                extra_fields={},
            )
            output.extra_fields.update({"turn_scores": [], "tool_rewards": []})
            # what `_compute_score` sets from the reward loop
            output.reward_score = float(row["reward"])
            output.extra_fields["reward_extra_info"] = {}
            asyncio.run(worker._agent_loop_postprocess(output, False, session_id=session, **kwargs))
        tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})


class Tokenizer:
    eos_token_id = EOS


def v1_trainer(m: Any, config: Any, dp: int) -> Any:
    trainer = object.__new__(m.trainer_sync.PPOTrainerSync)
    trainer.config = config
    trainer.use_critic = False
    trainer.global_steps = 1
    trainer.trainer_mode = "sync"
    trainer.parameter_sync_step = 1
    trainer.tokenizer = Tokenizer()
    trainer.actor_rollout_wg = type("Group", (), {"_dispatch_info": {"actor": list(range(dp))}})()
    trainer.replay_buffer = trainer._build_replay_buffer()
    return trainer


def v1_ranks(m: Any, tq: Any, config: Any, case: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """V1's step from the replay buffer to each rank's TensorDict: the sampled keys, then
    the data each actor rank reads."""
    trainer = v1_trainer(m, config, case["dp"])
    batch, _ = trainer.replay_buffer.sample(
        global_steps=1, partition_id="train", batch_size=case["groups"]
    )
    sampled = list(batch.keys)
    batch = trainer._balance_batch(batch, metrics={})
    batch = trainer._compute_old_log_prob(batch, metrics={})
    batch = trainer._compute_advantage(batch, metrics={})
    # the dispatch: KVBatchMeta -> BatchMeta, chunked by rank; each worker's tqbridge reads
    # its chunk's fields from TransferQueue
    (chunks,), _ = m.dispatch._split_args_kwargs_data_proto(case["dp"], batch)
    bridge = m.tq_bridge
    tags = dict(zip(batch.keys, batch.tags, strict=True))
    ranks = []
    for chunk in chunks:
        keys = bridge.batch_meta2kv_batch_meta(chunk).keys
        ranks.append((keys, [tags[k] for k in keys], bridge._meta_to_realdata(chunk)))
    assert [k for keys, _, _ in ranks for k in keys] == list(batch.keys)
    tq.kv_clear(keys=batch.keys, partition_id="train")
    return sampled, ranks


def assert_same_rank(got: Any, want: Any) -> None:
    import torch
    from tensordict import NonTensorData, NonTensorStack

    (got_keys, got_tags, got_data), (want_keys, want_tags, want_data) = got, want
    assert got_keys == want_keys and got_tags == want_tags
    assert sorted(got_data.keys()) == sorted(want_data.keys())
    for key in want_data.keys():
        a, b = got_data[key], want_data[key]
        assert type(a) is type(b), key
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and a.is_nested == b.is_nested, key
            if b.is_nested:
                assert torch.equal(a.offsets(), b.offsets()), key
                a, b = a.values(), b.values()
            assert a.shape == b.shape and torch.equal(a, b), key
            assert a.numpy().tobytes() == b.numpy().tobytes(), key  # -0.0 and NaN bits too
        elif isinstance(b, NonTensorStack):
            assert a.tolist() == b.tolist(), key
        elif isinstance(b, NonTensorData):
            assert a.data == b.data, key
        else:  # what TransferQueue gives a non-tensor field back as (a list)
            assert list(a) == list(b), key


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"dp{c['dp']}-n{c['n']}-g{c['groups']}")
def test_v1_ranks_from_the_hook_are_v1s_own(
    tq: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: dict[str, Any]
) -> None:
    from rollout_shards_loader.verl_v1 import StepAgentLoopManager

    m = verl_modules()
    rows = v1_rows(case, seed=case["dp"] * 31 + case["n"])
    write_step(tmp_path / "in", rows, step=5)
    manifest = build(
        tmp_path / "in",
        tmp_path / "out",
        trainer="verl",
        verl_target="v1",
        dp_size=case["dp"],
        rollout_n=case["n"],
        train_batch_size=case["groups"],
        max_prompt_length=9,
        max_response_length=9,
        pad_token_id=0,
    )
    assert manifest["settings"]["verl_target"] == "v1"
    config = verl_config(tmp_path / "out", case)
    runs = []
    for source in ("hook", "verl"):
        # the pad rows' uid, one per batch, from uuid4: the same in both runs
        pad_ids = itertools.count(1000)
        monkeypatch.setattr(m.padding.uuid, "uuid4", lambda ids=pad_ids: uuid.UUID(int=next(ids)))
        batch = prompts(m, case["groups"], step=1)
        uids = submit(tq, batch, step=1)
        if source == "hook":
            hook = StepAgentLoopManager.create(config=config, llm_client=None)
            assert hook.first_step == 5
            hook.generate_sequences(batch)
        else:
            verl_agent_loop(m, tq, batch, rows, case["n"])
        sampled, ranks = v1_ranks(m, tq, config, case)
        # group after group in the step's order
        assert sampled == [f"{u}_{s}_0" for u in uids for s in range(case["n"])]
        runs.append(ranks)
        tq.kv_clear(keys=uids, partition_id="train")
    hook_ranks, verl_ranks = runs
    assert len(hook_ranks) == case["dp"]
    rows_per_rank = {len(keys) for keys, _, _ in hook_ranks}
    assert len(rows_per_rank) == 1
    padded = sum(t.get("is_padding", False) for _, tags, _ in hook_ranks for t in tags)
    assert padded == -len(rows) % math.lcm(case["dp"], case["mini"] * case["n"])
    for got, want in zip(hook_ranks, verl_ranks, strict=True):
        assert "advantages" in got[2].keys() and "old_log_probs" in got[2].keys()
        assert_same_rank(got, want)


def test_the_hook_refuses_a_legacy_step_and_validation(tq: Any, tmp_path: Path) -> None:
    from rollout_shards_loader.verl_v1 import StepAgentLoopManager

    m = verl_modules()
    case = {"dp": 1, "n": 2, "groups": 2, "mini": 2, "std": True}
    write_step(tmp_path / "in", v1_rows(case, seed=3))
    build(
        tmp_path / "in",
        tmp_path / "out",
        trainer="verl",
        rollout_n=2,
        train_batch_size=2,
        max_prompt_length=9,
        max_response_length=9,
        pad_token_id=0,
    )
    hook = StepAgentLoopManager.create(config=verl_config(tmp_path / "out", case))
    batch = prompts(m, 2, step=1)
    with pytest.raises(ValueError, match=r"verl_target=legacy.*--verl-target v1"):
        hook.generate_sequences(batch)
    m.tensordict_utils.assign_non_tensor_data(batch, "validate", True)
    with pytest.raises(ValueError, match="val_before_train=False"):
        hook.generate_sequences(batch)


def test_the_v1_target_refuses_an_empty_response_in_one_line(tmp_path: Path) -> None:
    from pipeline.errors import StepError

    rows = case_rows(groups=2, n=2, seed=11, max_prompt=4, max_response=4)
    for row in rows:
        if row["response_length"] == 0:
            row["tokens"], row["response_length"] = [*row["tokens"], 5], 1
            row["loss_mask"] = None
            row["rollout_log_probs"] = [-1.0]
    rows[2]["tokens"] = rows[2]["tokens"][: len(rows[2]["tokens"]) - rows[2]["response_length"]]
    rows[2]["response_length"], rows[2]["loss_mask"] = 0, None
    rows[2]["rollout_log_probs"] = []
    write_step(tmp_path / "in", rows)
    settings = {
        "trainer": "verl",
        "rollout_n": 2,
        "train_batch_size": 2,
        "max_prompt_length": 9,
        "max_response_length": 9,
        "pad_token_id": 0,
    }
    # the legacy trainer holds an empty response (its score in the last column)
    assert build(tmp_path / "in", tmp_path / "legacy", **settings)["settings"]["verl_target"] == (
        "legacy"
    )
    with pytest.raises(StepError) as refused:
        build(tmp_path / "in", tmp_path / "v1", verl_target="v1", **settings)
    text = str(refused.value)
    assert "v1_empty_response" in text and "--verl-target legacy" in text
    assert "\n" not in text.strip() and "(2, 0)" in text
    assert not (tmp_path / "v1" / "step=1").exists()
    with pytest.raises(Exception, match="verl_target: 'v2' is not a verl trainer"):
        build(tmp_path / "in", tmp_path / "v2", verl_target="v2", **settings)
