"""The settings model: every setting of CONTRACT.md section 3, named as miles' flags."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import UsageError

Estimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
NORMALIZING_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")


def _setting(description: str, default: Any = dataclasses.MISSING, ge: int | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"description": description, "ge": ge})


@dataclasses.dataclass(frozen=True)
class Settings:
    """Effective settings of one build; shared by the CLI, the Dagster run config and tests.

    Checked when made: each value against its field's type (integers strictly, booleans
    and texts as pydantic's lax mode reads them, which the settings used before), then
    the settings against each other. `make_settings` words every problem as one line."""

    global_batch_size: int = _setting(
        "Samples per optimizer step (rollouts per step for compact batches).", ge=1
    )
    dp_size: int = _setting("Data-parallel ranks, one shard file each.", 1, ge=1)
    use_dynamic_global_batch_size: bool = _setting("One optimizer step per rollout step.", False)
    disable_rollout_trim_samples: bool = _setting("Keep every sample.", False)
    advantage_estimator: Estimator = _setting("Advantage estimator.", "grpo")
    rewards_normalization: bool = _setting(
        "Normalize rewards per prompt group (--disable-rewards-normalization).", True
    )
    grpo_std_normalization: bool = _setting(
        "Divide by the group std (--disable-grpo-std-normalization).", True
    )
    reward_key: str | None = _setting("Field of a struct `reward`.", None)
    n_samples_per_prompt: int | None = _setting(
        "Fixed-fanout reward groups when `group_index` is missing.", None, ge=1
    )
    rollout_batch_size: int | None = _setting(
        "Prompts per rollout step, with n_samples_per_prompt.", None, ge=1
    )
    balance_data: bool = _setting("Balance tokens across ranks.", False)
    micro_batch_size: int | None = _setting("Fixed micro-batch size.", None, ge=1)
    use_dynamic_batch_size: bool = _setting("Token-budget micro-batches.", False)
    max_tokens_per_gpu: int | None = _setting("Token budget per micro-batch and GPU.", None, ge=1)
    cp_size: int | None = _setting(
        "Context parallel size; setting it turns on the rollout-side schedule.", None, ge=1
    )
    vpp_size: int | None = _setting("Virtual pipeline stages (null means 1).", None, ge=1)
    microbatch_group_size_per_vp_stage: int | None = _setting(
        "Micro-batch group per virtual pipeline stage.", None, ge=1
    )
    allow_partial_train_step: bool = _setting(
        "One smaller final train step instead of dropping trailing rollouts.", False
    )
    on_invalid: Literal["fail", "quarantine"] = _setting(
        "`fail`: write nothing for an invalid step; `quarantine`: set invalid trajectories aside.",
        "fail",
    )
    rollout_id_policy: Literal["strict", "repair"] = _setting(
        "`repair` fixes legacy rollout ids (before miles PR #2536) and counts them.", "strict"
    )
    require_success_marker: bool = _setting(
        "Read a step folder only once its producer wrote step=<N>/_SUCCESS.", False
    )

    def __post_init__(self) -> None:
        parsed, problems = _parse_fields(vars(self))
        if problems:
            raise SettingsError(problems)
        for name, value in parsed.items():  # "yes" read as true, and the like
            object.__setattr__(self, name, value)
        if (problem := _inconsistency(self)) is not None:
            raise SettingsError([problem])

    @property
    def normalizes_rewards(self) -> bool:
        return self.rewards_normalization and self.advantage_estimator in NORMALIZING_ESTIMATORS

    @property
    def uses_schedule(self) -> bool:
        return self.cp_size is not None

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, as JSON values (the manifest's `settings`)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The settings as compact JSON, as the rerun digests hash them."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


class SettingsError(ValueError):
    """Settings that cannot be; `problems` as `make_settings` prints them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@functools.cache
def setting_types() -> dict[str, Any]:
    """Each setting's type, resolved (the annotations are text under `__future__`)."""
    return typing.get_type_hints(Settings)


def setting_fields() -> list[tuple[str, Any, str]]:
    """(name, type, description) of every setting, in the contract's order."""
    types = setting_types()
    return [
        (f.name, types[f.name], f.metadata["description"]) for f in dataclasses.fields(Settings)
    ]


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_NOT_BOOL = "Input should be a valid boolean"
_UNREAD_BOOL = "Input should be a valid boolean, unable to interpret input"


def _as_bool(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        text = value.lower()
        return (text in _TRUE, None) if text in _TRUE | _FALSE else (None, _UNREAD_BOOL)
    if isinstance(value, int):
        if abs(value) >= 2**63:
            return None, _NOT_BOOL
        return (bool(value), None) if value in (0, 1) else (None, _UNREAD_BOOL)
    if isinstance(value, float):
        if value in (0.0, 1.0):
            return bool(value), None
        return None, _UNREAD_BOOL if math.isfinite(value) and value.is_integer() else _NOT_BOOL
    return None, _NOT_BOOL


def _as_str(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        try:
            return value.decode(), None
        except UnicodeDecodeError:
            return (
                None,
                "Input should be a valid string, unable to parse raw data as a unicode string",
            )
    return None, "Input should be a valid string"


def non_null(kind: Any) -> Any:
    """A setting's type without null: `int` of `int | None`, `bool` of `bool`."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if isinstance(kind, types.UnionType) and args else kind


def _parse(value: Any, kind: Any, ge: int | None) -> tuple[Any, str | None]:
    """`value` read as `kind`, or why it cannot be (in pydantic's words)."""
    if (base := non_null(kind)) is not kind:
        if value is None:
            return None, None
        kind = base
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if isinstance(value, str) and value in choices:
            return value, None
        quoted = [repr(choice) for choice in choices]
        return None, f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}"
    if kind is bool:
        return _as_bool(value)
    if kind is str:
        return _as_str(value)
    if type(value) is not int:  # strict: no bool, float or text for an integer
        return None, "Input should be a valid integer"
    if ge is not None and value < ge:
        return None, f"Input should be greater than or equal to {ge}"
    return value, None


def _parse_fields(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The given settings read as their types, and a `name: problem` for each one that is
    missing, of the wrong type or unknown, in field order, unknown names last."""
    types = setting_types()
    parsed, problems = {}, []
    for f in dataclasses.fields(Settings):
        if f.name not in values:
            if f.default is dataclasses.MISSING:
                problems.append(f"{f.name}: Field required")
            continue
        value, problem = _parse(values[f.name], types[f.name], f.metadata["ge"])
        if problem is None:
            parsed[f.name] = value
        else:
            problems.append(f"{f.name}: {problem}")
    problems += [f"{name}: Extra inputs are not permitted" for name in values if name not in types]
    return parsed, problems


def _inconsistency(s: Settings) -> str | None:
    """What makes a set of well-typed settings impossible, or None."""
    if s.use_dynamic_global_batch_size and s.disable_rollout_trim_samples:
        return "use_dynamic_global_batch_size needs trimming: drop disable_rollout_trim_samples"
    if s.global_batch_size % s.dp_size:
        return (
            f"global_batch_size={s.global_batch_size} must be divisible by "
            f"dp_size={s.dp_size} (Megatron refuses it at start-up, and ranks would run "
            "different numbers of steps): change global_batch_size or dp_size"
        )
    if s.use_dynamic_batch_size and s.max_tokens_per_gpu is None:
        return "use_dynamic_batch_size needs max_tokens_per_gpu"
    if s.cp_size is not None and not s.use_dynamic_batch_size and s.micro_batch_size is None:
        return (
            "cp_size turns on the rollout-side schedule: set micro_batch_size "
            "or use_dynamic_batch_size with max_tokens_per_gpu"
        )
    if (s.vpp_size or 1) > 1 and s.microbatch_group_size_per_vp_stage is None:
        return "vpp_size > 1 needs microbatch_group_size_per_vp_stage"
    return None


# Boolean settings that default to on are turned off by a miles-style --disable-* flag.
DISABLE_FLAGS = {
    "rewards_normalization": "disable_rewards_normalization",
    "grpo_std_normalization": "disable_grpo_std_normalization",
}


def read_config(path: str | Path | None) -> dict[str, Any]:
    """Settings from a YAML file (a mapping of setting names), or {} without one."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise UsageError(f"config {path} is not a text (UTF-8) YAML file") from None
    import yaml  # only a step with a config file pays for the import

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        # PyYAML's message spans lines (a caret under the spot): one line for the user.
        reason = " ".join(str(exc).split())
        raise UsageError(f"config {path} is not valid YAML: {reason}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"config {path} must be a mapping of setting names to values")
    for flag, setting in ((v, k) for k, v in DISABLE_FLAGS.items()):
        if flag in data:
            data[setting] = not data.pop(flag)
    return data


def make_settings(values: Mapping[str, Any]) -> Settings:
    """Settings from plain values (files, flags, run config); a usage error names every
    problem: missing, unknown or mistyped settings first, else the first inconsistency."""
    parsed, problems = _parse_fields(values)
    if problems:
        raise UsageError(f"invalid settings: {'; '.join(problems)}")
    try:
        return Settings(**parsed)
    except SettingsError as exc:
        raise UsageError(f"invalid settings: {exc}") from None


# An input root may carry the settings its data was written for; they rank below
# --config and flags.
DATA_SETTINGS = "rollout-shards.yaml"


def data_settings_files(inputs: list[str | Path]) -> list[Path]:
    return [Path(p) / DATA_SETTINGS for p in inputs if (Path(p) / DATA_SETTINGS).is_file()]


def load_settings(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> Settings:
    """Defaults, then settings beside the data, then the YAML file, then explicit
    overrides (flags or run config)."""
    values: dict[str, Any] = {}
    for path in data_configs:
        values.update(read_config(path))
    values.update(read_config(config))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return make_settings(values)
