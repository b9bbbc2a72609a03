"""The settings model: every setting of CONTRACT.md section 3, named as miles' flags."""

from __future__ import annotations

import functools
import json
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import UsageError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

Estimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
NORMALIZING_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")

# A count: an integer of at least 1, never a bool, a float or a text.
Count = Annotated[int, Field(strict=True, ge=1)]


class Settings(BaseModel):
    """Effective settings of one build; shared by the CLI, the Dagster run config and tests.

    Checked when made: each value against its field's type (integers strictly, booleans
    and texts in pydantic's lax mode: "yes" is true), then the settings against each other.
    `make_settings` words every problem as one line."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: Count = Field(
        description="Samples per optimizer step (rollouts per step for compact batches)."
    )
    dp_size: Count = Field(1, description="Data-parallel ranks, one shard file each.")
    use_dynamic_global_batch_size: bool = Field(
        False, description="One optimizer step per rollout step."
    )
    disable_rollout_trim_samples: bool = Field(False, description="Keep every sample.")
    advantage_estimator: Estimator = Field("grpo", description="Advantage estimator.")
    rewards_normalization: bool = Field(
        True, description="Normalize rewards per prompt group (--disable-rewards-normalization)."
    )
    grpo_std_normalization: bool = Field(
        True, description="Divide by the group std (--disable-grpo-std-normalization)."
    )
    reward_key: str | None = Field(None, description="Field of a struct `reward`.")
    n_samples_per_prompt: Count | None = Field(
        None, description="Fixed-fanout reward groups when `group_index` is missing."
    )
    rollout_batch_size: Count | None = Field(
        None, description="Prompts per rollout step, with n_samples_per_prompt."
    )
    balance_data: bool = Field(False, description="Balance tokens across ranks.")
    micro_batch_size: Count | None = Field(None, description="Fixed micro-batch size.")
    use_dynamic_batch_size: bool = Field(False, description="Token-budget micro-batches.")
    max_tokens_per_gpu: Count | None = Field(
        None, description="Token budget per micro-batch and GPU."
    )
    cp_size: Count | None = Field(
        None, description="Context parallel size; setting it turns on the rollout-side schedule."
    )
    vpp_size: Count | None = Field(None, description="Virtual pipeline stages (null means 1).")
    microbatch_group_size_per_vp_stage: Count | None = Field(
        None, description="Micro-batch group per virtual pipeline stage."
    )
    allow_partial_train_step: bool = Field(
        False, description="One smaller final train step instead of dropping trailing rollouts."
    )
    on_invalid: Literal["fail", "quarantine"] = Field(
        "fail",
        description="`fail`: write nothing for an invalid step; "
        "`quarantine`: set invalid trajectories aside.",
    )
    rollout_id_policy: Literal["strict", "repair"] = Field(
        "strict",
        description="`repair` fixes legacy rollout ids (before miles PR #2536) and counts them.",
    )
    require_success_marker: bool = Field(
        False, description="Read a step folder only once its producer wrote step=<N>/_SUCCESS."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (problem := _inconsistency(self)) is not None:
            raise SettingsError(problem)
        return self

    @property
    def normalizes_rewards(self) -> bool:
        return normalizes(self.advantage_estimator, self.rewards_normalization)

    @property
    def uses_schedule(self) -> bool:
        return self.cp_size is not None

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, checked as the settings are when made."""
        return Settings.model_validate({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, as JSON values (the manifest's `settings`)."""
        return self.model_dump()

    def to_json(self) -> str:
        """The settings as compact JSON, as the rerun digests hash them."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def normalizes(estimator: str, rewards_normalization: bool) -> bool:
    """Whether rewards are normalized per prompt group (miles' estimators that do)."""
    return rewards_normalization and estimator in NORMALIZING_ESTIMATORS


# The settings the row and file rules read; the rest shape the batch (trim, layout, ranks).
ROW_SETTINGS = (
    "advantage_estimator",
    "rewards_normalization",
    "reward_key",
    "on_invalid",
    "rollout_id_policy",
    "require_success_marker",
)


def _field_of_settings(name: str) -> Any:
    """A field of `Settings` (its default and description), for a model sharing it."""
    return Settings.model_fields[name]


class RowSettings(BaseModel):
    """The settings of `Settings` that reading and validating rows needs (`validate` without
    a global batch size checks the rows alone); the fields are `Settings`' own."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    advantage_estimator: Estimator = _field_of_settings("advantage_estimator")
    rewards_normalization: bool = _field_of_settings("rewards_normalization")
    reward_key: str | None = _field_of_settings("reward_key")
    on_invalid: Literal["fail", "quarantine"] = _field_of_settings("on_invalid")
    rollout_id_policy: Literal["strict", "repair"] = _field_of_settings("rollout_id_policy")
    require_success_marker: bool = _field_of_settings("require_success_marker")

    @property
    def normalizes_rewards(self) -> bool:
        return normalizes(self.advantage_estimator, self.rewards_normalization)


class SettingsError(ValueError):
    """Well-typed settings that cannot go together."""


def _plain(kind: Any) -> Any:
    """A field's type without its constraints: `int | None` of `Count | None`."""
    if typing.get_origin(kind) is Annotated:
        return typing.get_args(kind)[0]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        plain = [_plain(arg) for arg in typing.get_args(kind)]
        return functools.reduce(operator.or_, plain)
    return kind


def setting_types() -> dict[str, Any]:
    """Each setting's type (`int | None` for an optional count)."""
    return {name: _plain(f.annotation) for name, f in Settings.model_fields.items()}


def setting_fields() -> list[tuple[str, Any, str]]:
    """(name, type, description) of every setting, in the contract's order."""
    kinds = setting_types()
    return [(name, kinds[name], f.description or "") for name, f in Settings.model_fields.items()]


def non_null(kind: Any) -> Any:
    """A setting's type without null: `int` of `int | None`, `bool` of `bool`."""
    if typing.get_origin(kind) not in (typing.Union, types.UnionType):
        return kind
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if len(args) == 1 else kind


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
    from pydantic import TypeAdapter

    from pipeline.yaml_config import ConfigError, load_mapping

    try:
        data = load_mapping(text)
    except ConfigError as exc:
        raise UsageError(f"config {path}{exc}") from None
    for setting, flag in DISABLE_FLAGS.items():
        if flag not in data:
            continue
        if setting in data:
            raise UsageError(f"config {path} sets both {setting} and {flag}: keep one")
        try:
            data[setting] = not TypeAdapter(bool).validate_python(data.pop(flag))
        except ValidationError as exc:
            raise UsageError(f"invalid settings: {flag}: {exc.errors()[0]['msg']}") from None
    return data


def make_settings(values: Mapping[str, Any]) -> Settings:
    """Settings from plain values (files, flags, run config); a usage error names every
    problem: missing, unknown or mistyped settings first, else the first inconsistency."""
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        problems = [_problem(error) for error in exc.errors()]
        raise UsageError(f"invalid settings: {'; '.join(problems)}") from None


def _problem(error: ErrorDetails) -> str:
    """One of pydantic's errors as `name: what is wrong`, or the inconsistency as worded."""
    from pipeline.yaml_config import setting_name

    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, SettingsError):
        return str(cause)
    return f"{'.'.join(map(setting_name, error['loc']))}: {error['msg']}"


# An input root may carry the settings its data was written for; they rank below
# --config and flags.
DATA_SETTINGS = "rollout-shards.yaml"


def data_settings_files(inputs: Sequence[str | Path]) -> list[Path]:
    """The settings file of each input's root: an input root holds it; a step file or
    folder given alone finds the one of the root it sits in (`root/step=<N>.parquet`,
    `root/step=<N>/part.jsonl`)."""
    found: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        root = path if path.is_dir() else path.parent
        if root.name.lower().startswith("step=") and not (root / DATA_SETTINGS).is_file():
            root = root.parent
        if (root / DATA_SETTINGS).is_file() and root / DATA_SETTINGS not in found:
            found.append(root / DATA_SETTINGS)
    return found


def setting_values(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> dict[str, Any]:
    """The settings given: beside the data, then the YAML file, then explicit overrides
    (flags or run config), each above the one before."""
    values: dict[str, Any] = {}
    for path in data_configs:
        values.update(read_config(path))
    values.update(read_config(config))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values


def load_settings(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> Settings:
    """Defaults below the settings given (`setting_values`), checked."""
    return make_settings(setting_values(config, data_configs, **overrides))


def make_row_settings(values: Mapping[str, Any]) -> RowSettings:
    """The row settings among `values` (the others are not checked here)."""
    try:
        return RowSettings.model_validate(values)
    except ValidationError as exc:
        problems = [_problem(error) for error in exc.errors()]
        raise UsageError(f"invalid settings: {'; '.join(problems)}") from None
