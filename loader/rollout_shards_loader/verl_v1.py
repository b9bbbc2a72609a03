"""verl 0.9.1's V1 trainer (`trainer.use_v1=true`, the default) trained from built steps:
`StepAgentLoopManager` is an `actor_rollout_ref.rollout.agent.agent_loop_manager_class`
(the contract in `verl/trainer/main_ppo.py`: implement `generate_sequences` and put the
agent loop's outputs into TransferQueue) that, for the prompts V1's dataloader hands it,
puts a built step's rows into TransferQueue instead of generating: the fields and tags
`AgentLoopWorkerTQ._agent_loop_postprocess` writes, keys `{uid}_{session}_0`, group after
group in the step's order, and the prompt's status `finished` once its group is in. V1's
`ReplayBuffer` then takes them in that order (it lists a partition in insertion order), so
its `_balance_batch`, `_compute_advantage` and dispatch see the same rows in the same
order at every run: deterministic, which V1 with live rollouts (completion order) is not.

The trainer's config names the step folders (docs/verl.md):

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=rollout_shards_loader.verl_v1.StepAgentLoopManager
    +rollout_shards.root=SHARDS          # the build's --out: step=<N> folders
    +rollout_shards.first_step=N         # the step global step 1 trains on (default: the lowest)
    trainer.val_before_train=False trainer.test_freq=-1

Global step g reads `step=<first_step + g - 1>`, built with `--trainer verl --verl-target
v1`; the i-th prompt of V1's batch takes the step's i-th group (its uid is V1's, its other
dataset fields ride along as the agent loop's kwargs do; its tokens are the step's).
Imports verl, torch, tensordict and transfer_queue, which verl's environment has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_shards_loader._step import RankFiles, read_rank_files

SECTION = "rollout_shards"
PARTITION = "train"
# the columns of every rank file the hook reads (a V1 step is read whole, in rank order)
COLUMNS = (
    "tokens",
    "response_lengths",
    "total_lengths",
    "loss_masks",
    "raw_reward",
    "rollout_log_probs",
    "group_index",
)
# batch keys the agent loop worker consumes before the kwargs reach the post-processing
CONSUMED = ("validate", "agent_name", "__rollout_n__", "__do_sample__")
# what the single-turn agent loop and the reward loop leave in `extra_fields`
EXTRA_FIELDS: dict[str, Any] = {"turn_scores": [], "tool_rewards": [], "reward_extra_info": {}}
NUM_TURNS = 2  # the single-turn loop's user and assistant turns


def step_table(step_folder: str | Path, verify: bool = True) -> tuple[dict[str, Any], pa.Table]:
    """The manifest and every row of a V1 step, rank files concatenated in rank order (the
    step's order), all of one build and each file checked against the manifest."""

    def whole(read: RankFiles) -> tuple[dict[str, Any], pa.Table]:
        own = pq.read_table(pa.BufferReader(read.own))
        present = set(read.manifest.get("present_columns", []))
        names = [n for n in COLUMNS if n != "rollout_log_probs" or n in present]
        parts = [own.select(names)] + [read.parts[r].select(names) for r in sorted(read.parts)]
        return read.manifest, pa.concat_tables(parts)

    manifest, table = read_rank_files(
        step_folder,
        0,
        None,
        None,
        verify,
        whole,
        trainer="verl",
        # `batch_position` too: the shared check sees every rank's rows cover the step once
        other_columns=("batch_position", *COLUMNS),
    )
    target = manifest["settings"].get("verl_target", "legacy")
    if target != "v1":
        raise ValueError(
            f"{step_folder}: built for verl's legacy trainer (verl_target={target}): "
            "build it with --verl-target v1 for the V1 trainer, or read it with "
            "rollout_shards_loader.verl.read_rank under trainer.use_v1=false"
        )
    return manifest, table


def _prompt_kwargs(prompts: Any, i: int) -> dict[str, Any]:
    """Prompt `i`'s dataset fields as the agent loop's kwargs: a tensor's row, a
    non-tensor stack's item, a non-tensor value as it is."""
    import torch
    from tensordict import NonTensorData, NonTensorStack

    kwargs: dict[str, Any] = {}
    for key, value in prompts.items():
        if key in CONSUMED:
            continue
        if isinstance(value, torch.Tensor):
            kwargs[key] = value[i]
        elif isinstance(value, NonTensorStack):
            kwargs[key] = value[i].data
        elif isinstance(value, NonTensorData):
            kwargs[key] = value.data
        else:
            raise TypeError(f"prompt field {key!r}: {type(value).__name__} is not a batch field")
    return kwargs


def _flat(column: pa.ChunkedArray) -> list[np.ndarray]:
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy()
    values = lists.values.to_numpy(zero_copy_only=False)
    return [values[offsets[r] : offsets[r + 1]] for r in range(len(lists))]


def trajectory_fields(
    table: pa.Table, prompt_kwargs: list[dict[str, Any]], n: int
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Keys, fields and tags of every row of `table` (groups of `n` rows in the step's
    order) as the V1 agent loop worker puts a single-turn output scored by the reward loop."""
    import torch
    from verl.experimental.agent_loop import AgentLoopOutput
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
    from verl.utils.model import compute_position_id_with_mask

    tokens = _flat(table.column("tokens"))
    masks = _flat(table.column("loss_masks"))
    log_probs: list[np.ndarray | None] = (
        list(_flat(table.column("rollout_log_probs")))
        if "rollout_log_probs" in table.column_names
        else [None] * table.num_rows
    )
    response = table.column("response_lengths").to_pylist()
    reward = table.column("raw_reward").to_pylist()
    keys, fields, tags = [], [], []
    for row in range(table.num_rows):
        kwargs = {**prompt_kwargs[row // n], "session_id": row % n}
        cut = len(tokens[row]) - response[row]
        output = AgentLoopOutput(
            prompt_ids=tokens[row][:cut].tolist(),
            response_ids=tokens[row][cut:].tolist(),
            response_mask=masks[row].tolist(),
            response_logprobs=None if (lp := log_probs[row]) is None else lp.tolist(),
            reward_score=float(reward[row]),
            num_turns=NUM_TURNS,
            metrics=AgentLoopMetrics(),
            extra_fields={k: v.copy() for k, v in EXTRA_FIELDS.items()},
        )
        field = output.as_dict()
        field.update(kwargs)
        input_ids = torch.cat([field["prompts"], field["responses"]], dim=0)
        attention_mask = torch.ones_like(input_ids, dtype=torch.int64)
        field["loss_mask"] = field["response_mask"]
        field["input_ids"] = input_ids
        field["position_ids"] = compute_position_id_with_mask(attention_mask.unsqueeze(0)).squeeze(
            0
        )
        field["multi_modal_inputs"] = {}
        prompt_len, response_len = field["prompts"].size(0), field["responses"].size(0)
        keys.append(f"{kwargs['uid']}_{kwargs['session_id']}_0")
        fields.append(field)
        tags.append(
            {
                "status": "success",
                "prompt_len": prompt_len,
                "response_len": response_len,
                "seq_len": prompt_len + response_len,
                "global_steps": kwargs["global_steps"],
                "min_global_steps": None,
                "max_global_steps": None,
            }
        )
    return keys, fields, tags


class StepAgentLoopManager:
    """V1's agent loop manager over built steps (module docstring)."""

    def __init__(self, config: Any, root: Path, first_step: int, verify: bool = True) -> None:
        self.config = config
        self.root = root
        self.first_step = first_step
        self.verify = verify

    @classmethod
    def create(cls, config: Any, **clients: Any) -> StepAgentLoopManager:
        """What `TaskRunnerV1.init_agent_loop_manager` calls; the LLM, teacher and reward
        clients it passes are not used: the rows are generated and scored already."""
        section = config.get(SECTION) or {}
        if section.get("root") is None:
            raise ValueError(
                f"{SECTION}.root: required by rollout_shards_loader.verl_v1 (the build's "
                f"--out folder of step=<N> folders): add +{SECTION}.root=SHARDS to verl's config"
            )
        root = Path(section["root"])
        first = section.get("first_step")
        if first is None:
            steps = sorted(
                int(p.name.partition("=")[2])
                for p in root.glob("step=*")
                if p.name.partition("=")[2].isdigit()
            )
            if not steps:
                raise ValueError(f"{root}: no step=<N> folders: build the steps there first")
            first = steps[0]
        return cls(config, root, int(first), bool(section.get("verify", True)))

    def generate_sequences(self, prompts: Any) -> None:
        """Put the step of `prompts`' global step into TransferQueue, as V1's agent loop
        puts the trajectories of these prompts, and mark each prompt finished."""
        import transfer_queue as tq
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        if "validate" in prompts.keys() and bool(prompts["validate"]):
            raise ValueError(
                "rollout_shards_loader.verl_v1 has no validation rollouts: set "
                "trainer.val_before_train=False and trainer.test_freq=-1"
            )
        rollout = self.config.actor_rollout_ref.rollout
        kwargs = [_prompt_kwargs(prompts, i) for i in range(len(prompts))]
        global_steps = int(kwargs[0]["global_steps"])
        folder = self.root / f"step={self.first_step + global_steps - 1}"
        manifest, table = step_table(folder, self.verify)
        settings = manifest["settings"]
        n, groups = settings["rollout_n"], table.num_rows // settings["rollout_n"]
        if n != rollout.n or groups != len(prompts):
            raise ValueError(
                f"{folder}: {groups} groups of rollout_n={n}, but V1 asks for {len(prompts)} "
                f"prompts of actor_rollout_ref.rollout.n={rollout.n}: build the step with "
                "data.train_batch_size and rollout.n as the trainer runs"
            )
        if (
            rollout.get("calculate_log_probs", False)
            and "rollout_log_probs" not in table.column_names
        ):
            raise ValueError(
                f"{folder}: the step has no rollout_log_probs, but "
                "actor_rollout_ref.rollout.calculate_log_probs=True reads them: set it False"
            )
        keys, fields, tags = trajectory_fields(table, kwargs, n)
        uids = [k["uid"] for k in kwargs]
        tq.kv_batch_put(
            keys=uids, partition_id=PARTITION, tags=[{"status": "running"} for _ in uids]
        )
        tq.kv_batch_put(
            keys=keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags
        )
        tq.kv_batch_put(
            keys=uids, partition_id=PARTITION, tags=[{"status": "finished"} for _ in uids]
        )
