"""miles dumps as miles writes them: `Sample.to_dict()` rows saved by torch.save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TRIM_METADATA = {"dynamic_global_batch_size": 4}


def sample_dict(**fields: Any) -> dict[str, Any]:
    """What miles' `Sample.to_dict()` gives (miles/utils/types.py), with `fields` replaced."""
    sample: dict[str, Any] = {
        "group_index": 0,
        "index": 0,
        "rollout_id": None,
        "prompt": "What is 2+2?",
        "tokens": [1, 2, 3, 4, 5],
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "response": "4",
        "response_length": 2,
        "label": "4",
        "reward": 1.0,
        "loss_mask": None,
        "weight_versions": [],
        "rollout_log_probs": None,
        "rollout_sampling_mask": None,
        "rollout_routed_experts": None,
        "rollout_indexer_topk": None,
        "remove_sample": False,
        "teacher_log_probs": None,
        "opd_reverse_kl": None,
        "status": "completed",
        "metadata": {},
        "generate_function_path": None,
        "train_metadata": None,
        "reward_spec": None,
        "routing_key": None,
        "non_generation_time": 0.0,
        "spec_info": {
            "spec_num_correct_drafts": 0,
            "spec_num_proposed_drafts": 0,
            "spec_verify_ct": 0,
            "completion_tokens": 0,
        },
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }
    sample.update(fields)
    return sample


def write_dump(
    path: Path, step: int, samples: list[dict[str, Any]], metadata: dict | None = None
) -> Path:
    """As miles' save_debug_rollout_data (miles/ray/rollout/debug_data.py) writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "rollout_id": step,
            "metadata": TRIM_METADATA if metadata is None else metadata,
            "samples": samples,
        },
        path,
    )
    return path


def leaf_descriptor(node_id: int, parent: int | None, path_node_ids: list[int]) -> dict[str, Any]:
    """miles' v2 `metadata["leaf"]` (miles/rollout/session/v2/assembly.py)."""
    return {
        "node_id": node_id,
        "parent": parent,
        "path_node_ids": path_node_ids,
        "response_id": f"chatcmpl-{node_id}",
    }
