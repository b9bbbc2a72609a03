"""Forward FLOPs of each row from its token length: the workload `--balance-by-flops` packs
micro-batches and deals them to ranks by (SEMANTICS 7.7).

miles and slime estimate one sequence's cost with `calculate_fwd_flops([length], args)`
(`utils/flops_utils.py`): per layer the QKV projections, causal attention, the output
projection and a gated MLP, times the dense and MoE layer counts, plus the LM head. The
two differ only in when a model counts as MLA, so the arithmetic here takes a resolved
`ModelShape` and each trainer's profile says how its flags resolve (`miles_model_shape`).

The result is a float64 per row, bit for bit the Python float those functions return: the
integer terms are exact (int64, or Python integers where a length makes them larger), each
is rounded to float64 where the Python code mixes it with a float, and the float additions
and products run in the Python code's order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

INT64_MAX = np.iinfo(np.int64).max

# What Megatron's parser puts in miles' args for a model flag not given (its defaults:
# the MLA flags keep theirs even for a model without MLA, and miles' FLOPs read them).
MEGATRON_DEFAULTS = {
    "num_query_groups": 1,
    "moe_router_topk": 2,
    "moe_layer_freq": 1,
    "kv_lora_rank": 32,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
}


@dataclass(frozen=True)
class ModelShape:
    """A model's shape as the FLOPs arithmetic reads it, every choice made."""

    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    dense_ffn: int  # FFN width of a dense layer
    moe_ffn: int  # of an MoE layer: expert width times top-k, plus the shared experts
    dense_layers: int
    moe_layers: int
    q_lora_rank: int | None  # None: the plain query projection, q_head_dim wide per head
    kv_lora_rank: int | None  # None: the plain key and value projections
    q_head_dim: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    attention_qk_dim: int  # the QK^T product's width per head
    attention_v_dim: int  # the A*V product's width per head

    def projection_per_token(self) -> int:
        """QKV projection FLOPs of one token (an integer in both trainers' code)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.q_lora_rank is None:
            q = 2 * h * heads * self.q_head_dim
        else:
            q = 2 * self.q_lora_rank * (h + heads * (self.qk_head_dim + self.qk_pos_emb_head_dim))
        if self.kv_lora_rank is None:
            kv = 2 * 2 * h * self.num_query_groups * self.kv_channels
        else:
            kv = 2 * (
                self.kv_lora_rank * (h + heads * (self.qk_head_dim + self.v_head_dim))
                + h * self.qk_pos_emb_head_dim
            )
        return q + kv


def miles_model_shape(settings: Any) -> ModelShape:
    """The shape miles' `calculate_fwd_flops` reads from its args, from settings named as
    its (Megatron's) flags: a flag not given takes the value Megatron's parser gives it."""

    def given(name: str) -> Any:
        value = getattr(settings, name, None)  # a flag a trainer does not read: not given
        return MEGATRON_DEFAULTS.get(name) if value is None else value

    hidden, heads, layers = settings.hidden_size, settings.num_attention_heads, settings.num_layers
    kv_channels = settings.kv_channels if settings.kv_channels is not None else hidden // heads
    dense_layers, moe_layers, moe_ffn = layers, 0, 0
    if settings.num_experts is not None:
        expert_ffn = settings.moe_ffn_hidden_size or settings.ffn_hidden_size
        shared = settings.moe_shared_expert_intermediate_size or 0
        moe_ffn = expert_ffn * given("moe_router_topk") + shared
        pattern = given("moe_layer_freq")
        if isinstance(pattern, list):
            dense_layers = sum(1 for freq in pattern if freq == 0)
            moe_layers = sum(1 for freq in pattern if freq > 0)
        else:
            moe_layers = len(range(0, layers, pattern))
            dense_layers = layers - moe_layers
    qk, pos, v = given("qk_head_dim"), given("qk_pos_emb_head_dim"), given("v_head_dim")
    return ModelShape(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=given("num_query_groups"),
        kv_channels=kv_channels,
        vocab_size=settings.vocab_size,
        dense_ffn=settings.ffn_hidden_size,
        moe_ffn=moe_ffn,
        dense_layers=dense_layers,
        moe_layers=moe_layers,
        q_lora_rank=given("q_lora_rank"),
        kv_lora_rank=given("kv_lora_rank"),
        q_head_dim=kv_channels,
        qk_head_dim=qk,
        qk_pos_emb_head_dim=pos,
        v_head_dim=v,
        attention_qk_dim=qk + pos if pos else kv_channels,
        attention_v_dim=v if v else kv_channels,
    )


def _integers(lengths: np.ndarray, shape: ModelShape) -> np.ndarray:
    """The lengths as int64, or as Python integers when a term of the longest would pass
    int64 (every term grows with the length)."""
    longest = int(lengths.max()) if len(lengths) else 0
    h = shape.hidden_size
    per_token = max(
        shape.projection_per_token(),
        2 * h * h,
        2 * h * max(shape.dense_ffn, shape.moe_ffn) * 3,
        2 * h * shape.vocab_size,
    )
    quadratic = 2 * shape.num_attention_heads * max(shape.attention_qk_dim, shape.attention_v_dim)
    if max(longest * per_token, longest * longest * quadratic) <= INT64_MAX:
        return lengths.astype(np.int64)
    return lengths.astype(np.int64).astype(object)


def _as_float(values: np.ndarray) -> np.ndarray:
    """Integers rounded to the nearest float64, as Python rounds an int mixed with a float."""
    return values.astype(np.float64)


def _layer(s: np.ndarray, shape: ModelShape, ffn: int) -> np.ndarray:
    """One layer's FLOPs: ((qkv + attention) + output) + mlp, the attention a float."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    square = s * s
    # 2 * heads * s * s * d / 2: the exact integer heads * s * s * d, rounded once
    attention = _as_float(heads * square * shape.attention_qk_dim)
    attention = attention + _as_float(heads * square * shape.attention_v_dim)
    total = _as_float(s * shape.projection_per_token()) + attention
    total = total + _as_float(s * (2 * h * h))
    mlp: np.ndarray = total + _as_float(s * (2 * h * ffn * 3))
    return mlp


def forward_flops(lengths: np.ndarray, shape: ModelShape) -> np.ndarray:
    """Each row's forward FLOPs as a float64: `calculate_fwd_flops([length], args)`."""
    s = _integers(np.asarray(lengths).reshape(-1), shape)
    total = np.zeros(len(s), dtype=np.float64)
    if shape.dense_layers > 0:
        total = total + _layer(s, shape, shape.dense_ffn) * float(shape.dense_layers)
    if shape.moe_layers > 0:
        total = total + _layer(s, shape, shape.moe_ffn) * float(shape.moe_layers)
    flops: np.ndarray = total + _as_float(s * (2 * shape.hidden_size * shape.vocab_size))
    return flops


def slime_model_shape(settings: Any) -> ModelShape:
    """The shape slime's `calculate_fwd_flops` reads: the same flags and Megatron defaults
    as miles', but slime counts multi-latent attention only under `--multi-latent-attention`
    (not a setting here), so its projections and attention are the standard ones."""
    shape = miles_model_shape(settings)
    return dataclasses.replace(
        shape,
        q_lora_rank=None,
        kv_lora_rank=None,
        q_head_dim=shape.kv_channels,
        attention_qk_dim=shape.kv_channels,
        attention_v_dim=shape.kv_channels,
    )
