"""The settings model: every setting of CONTRACT.md section 3, named as miles' flags.

`Settings` is a frozen dataclass. A value that already has its field's exact type (as
argparse, YAML and Dagster's run config give them) is taken as it is; any other value goes
to pydantic, imported only then, which reads it in its lax mode ("yes" is true) or words
what is wrong with it. So a build with well-typed settings does not load pydantic, and a
mistyped, missing or unknown setting is worded by pydantic; settings that cannot go
together are worded here (`_inconsistency`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pipeline import settings_files as files
from pipeline.errors import UsageError
from pipeline.settings_files import DATA_SETTINGS as DATA_SETTINGS
from pipeline.settings_files import DISABLE_FLAGS as DISABLE_FLAGS
from pipeline.settings_files import data_settings_files as data_settings_files
from pipeline.trainers.miles.settings import FIELDS as MILES_FIELDS
from pipeline.trainers.miles.settings import MilesFlags, NonNegative, derived_global_batch_size
from pipeline.trainers.verl.settings import FIELDS as VERL_FIELDS
from pipeline.trainers.verl.settings import VerlSettings

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails

Estimator = Literal[
    "grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"
]
NORMALIZING_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")


class _Count:
    """The mark of a count: an integer of at least 1, never a bool, a float or a text."""


COUNT = _Count()
Count = Annotated[int, COUNT]


def _setting(
    description: str,
    default: Any = dataclasses.MISSING,
    recorded: bool = True,
    trainer: str | None = None,
) -> Any:
    """A field of the settings; `recorded=False`: a run option that does not change what is
    built (not in the manifest, not in the rerun digests); `trainer`: a setting of that
    trainer alone, named after its own configuration key."""
    metadata = {"description": description, "recorded": recorded, "trainer": trainer}
    return dataclasses.field(default=default, metadata=metadata)


class SettingsError(ValueError):
    """Settings that cannot be used: missing, unknown or mistyped, or well-typed settings
    that cannot go together. The text names every problem on one line."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings(MilesFlags, VerlSettings):
    """Effective settings of one build; shared by the CLI, the Dagster run config and tests.

    Checked when made: each value against its field's type (integers strictly, booleans
    and texts in pydantic's lax mode: "yes" is true), then the settings against each other
    (SettingsError). `make_settings` words every problem as one usage line."""

    trainer: str = _setting(
        "The trainer the shards are for: its profile (pipeline/trainers/) decides reward "
        "normalization, trimming, the DP split and the rank files.",
        "miles",
    )
    global_batch_size: Count | None = _setting(
        "Samples per optimizer step (rollouts per step for compact batches).", None
    )
    dp_size: Count = _setting("Data-parallel ranks, one shard file each.", 1)
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
    n_samples_per_prompt: Count | None = _setting(
        "Fixed-fanout reward groups when `group_index` is missing.", None
    )
    rollout_batch_size: Count | None = _setting(
        "Prompts per rollout step, with n_samples_per_prompt.", None
    )
    balance_data: bool = _setting("Balance tokens across ranks.", False)
    micro_batch_size: Count | None = _setting("Fixed micro-batch size.", None)
    use_dynamic_batch_size: bool = _setting("Token-budget micro-batches.", False)
    max_tokens_per_gpu: Count | None = _setting("Token budget per micro-batch and GPU.", None)
    cp_size: Count | None = _setting(
        "Context parallel size; setting it turns on the rollout-side schedule.", None
    )
    vpp_size: Count | None = _setting("Virtual pipeline stages (null means 1).", None)
    microbatch_group_size_per_vp_stage: Count | None = _setting(
        "Micro-batch group per virtual pipeline stage.", None
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
    stream_above: NonNegative | None = _setting(
        "MiB of input files on disk above which a step holds its per-token lists one part "
        "or one rank at a time (0: every step; null: never).",
        256,
        recorded=False,
    )
    ray_address: str | None = _setting("Ray cluster's GCS, or auto.", None, recorded=False)
    ray_above: NonNegative = _setting("MiB above which a step goes to Ray.", 256, recorded=False)

    def __post_init__(self) -> None:
        _take(self, _checked(type(self), self.values()))
        if (problem := _inconsistency(self)) is not None:
            raise SettingsError(problem)

    @property
    def normalizes_rewards(self) -> bool:
        return normalizes(self.advantage_estimator, self.rewards_normalization)

    @property
    def uses_schedule(self) -> bool:
        return self.cp_size is not None

    @property
    def stream_above_bytes(self) -> int | None:
        return None if self.stream_above is None else self.stream_above << 20

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, checked as the settings are when made."""
        return Settings(**_checked(Settings, {**self.values(), **changes}))

    def values(self) -> dict[str, Any]:
        """Every setting by name, run options included (what a worker is handed)."""
        return {f.name: getattr(self, f.name) for f in _fields()}

    def to_dict(self) -> dict[str, Any]:
        """Every recorded setting of this trainer by name, as JSON values (the manifest's
        `settings`): the run options, which change no output byte, and the settings of
        other trainers are left out."""
        from pipeline import trainers

        read = trainers.profile(self.trainer).settings
        return {
            f.name: getattr(self, f.name)
            for f in _fields()
            if f.metadata.get("recorded", True) and (f.name in COMMON_SETTINGS or f.name in read)
        }

    def to_json(self) -> str:
        """The settings as compact JSON, as the rerun digests hash them."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


def normalizes(estimator: str, rewards_normalization: bool) -> bool:
    """Whether rewards are normalized per prompt group (miles' estimators that do)."""
    return rewards_normalization and estimator in NORMALIZING_ESTIMATORS


def _as_in_settings(name: str) -> Any:
    """A field of `Settings` (its default and description), for a model sharing it."""
    (same,) = [f for f in dataclasses.fields(Settings) if f.name == name]
    return dataclasses.field(default=same.default, metadata=same.metadata)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSettings:
    """The settings of `Settings` that reading and validating rows needs (`validate` without
    a global batch size checks the rows alone); the fields are `Settings`' own."""

    trainer: str = _as_in_settings("trainer")
    advantage_estimator: Estimator = _as_in_settings("advantage_estimator")
    rewards_normalization: bool = _as_in_settings("rewards_normalization")
    reward_key: str | None = _as_in_settings("reward_key")
    on_invalid: Literal["fail", "quarantine"] = _as_in_settings("on_invalid")
    rollout_id_policy: Literal["strict", "repair"] = _as_in_settings("rollout_id_policy")
    require_success_marker: bool = _as_in_settings("require_success_marker")

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        _take(self, _checked(type(self), values))

    @property
    def normalizes_rewards(self) -> bool:
        return normalizes(self.advantage_estimator, self.rewards_normalization)


# Settings or RowSettings (a plain `type`, which the caches below can key on).
Model = type


@functools.cache
def _fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields of `Settings` in the contract's order: its own, then miles' data-path
    flags (`pipeline.trainers.miles.settings`), then verl's
    (`pipeline.trainers.verl.settings`): base classes, whose fields dataclasses list first."""
    fields = dataclasses.fields(Settings)
    return tuple(sorted(fields, key=lambda f: (f.name in VERL_FIELDS, f.name in MILES_FIELDS)))


def _minimum(kind: Any) -> int:
    """The least value of a marked integer (a count: 1)."""
    mark = typing.get_args(kind)[1]
    return int(getattr(mark, "value", 1))


@functools.cache
def _hints(model: Model) -> dict[str, Any]:
    """Each field's type as annotated (a count keeps its mark)."""
    return typing.get_type_hints(model, include_extras=True)


def _take(settings: Settings | RowSettings, values: Mapping[str, Any]) -> None:
    """Put the checked `values` (a lax "yes" read as true) in the frozen `settings`."""
    for name, value in values.items():
        if value is not getattr(settings, name):
            object.__setattr__(settings, name, value)


def _exact(kind: Any, value: Any) -> bool:
    """Whether `value` has exactly the type `kind` (pydantic would take it unchanged)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_exact(arg, value) for arg in typing.get_args(kind))
    if origin is Annotated:  # a count, or a size
        return type(value) is int and value >= _minimum(kind)
    if origin is list:
        return type(value) is list and all(_exact(typing.get_args(kind)[0], v) for v in value)
    if origin is Literal:
        return type(value) is str and value in typing.get_args(kind)
    if kind is type(None):
        return value is None
    return type(value) is kind


def _checked(model: Model, values: Mapping[str, Any]) -> dict[str, Any]:
    """`model`'s fields among `values`, checked; SettingsError naming every missing,
    unknown (for `Settings`) or mistyped one, worded by pydantic."""
    kinds = _hints(model)
    known = all(name in kinds for name in values) or model is RowSettings
    fields = {f.name: f for f in dataclasses.fields(model)}
    given = all(name in values for name, f in fields.items() if f.default is dataclasses.MISSING)
    if known and given and all(_exact(kinds[k], v) for k, v in values.items() if k in kinds):
        return {name: values[name] for name in kinds if name in values}
    from pydantic import ValidationError

    try:
        return dict(_pydantic_model(model).model_validate(values))
    except ValidationError as exc:
        raise SettingsError("; ".join(_problem(error) for error in exc.errors())) from None


@functools.cache
def _pydantic_model(model: Model) -> type[BaseModel]:
    """A pydantic model of `model`'s fields: a count strict and at least 1, booleans and
    texts lax; unknown fields refused by `Settings` and ignored by `RowSettings`."""
    from pydantic import ConfigDict, Field, create_model

    def typed(kind: Any) -> Any:
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            return functools.reduce(operator.or_, map(typed, typing.get_args(kind)))
        if typing.get_origin(kind) is Annotated:
            return Annotated[int, Field(strict=True, ge=_minimum(kind))]
        if typing.get_origin(kind) is list:
            return list[typed(typing.get_args(kind)[0])]  # type: ignore[misc]
        return kind

    kinds = _hints(model)
    fields: dict[str, Any] = {
        f.name: (typed(kinds[f.name]), ... if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(model)
    }
    extra: Literal["forbid", "ignore"] = "forbid" if model is Settings else "ignore"
    return create_model(model.__name__, __config__=ConfigDict(extra=extra), **fields)


def _problem(error: ErrorDetails) -> str:
    """One of pydantic's errors as `name: what is wrong`."""
    from pipeline.yaml_config import setting_name

    return f"{'.'.join(map(setting_name, error['loc']))}: {error['msg']}"


# The settings the row and file rules read; the rest shape the batch (trim, layout, ranks).
ROW_SETTINGS = tuple(f.name for f in dataclasses.fields(RowSettings))
# Settings of every trainer: which trainer, how rows are read and checked, run options.
COMMON_SETTINGS = frozenset(
    ("trainer", "stream_above", "ray_address", "ray_above", "on_invalid", "rollout_id_policy")
) | {"require_success_marker", "reward_key"}


def trainer_settings(trainer: str) -> frozenset[str]:
    """The settings marked as `trainer`'s alone (named after its configuration keys)."""
    return frozenset(f.name for f in _fields() if f.metadata.get("trainer") == trainer)


def valued_booleans() -> frozenset[str]:
    """Booleans named after verl's keys, given a value as there (`--balance-batch false`)."""
    kinds = setting_types()
    return frozenset(name for name in trainer_settings("verl") if kinds[name] is bool)


def shared_settings() -> frozenset[str]:
    """The settings of no one trainer and not common: miles' flags, which slime shares."""
    return frozenset(
        f.name
        for f in _fields()
        if f.metadata.get("trainer") is None and f.name not in COMMON_SETTINGS
    )


def _plain(kind: Any) -> Any:
    """A field's type without its mark: `int | None` of `Count | None`."""
    if typing.get_origin(kind) is Annotated:
        return typing.get_args(kind)[0]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        plain = [_plain(arg) for arg in typing.get_args(kind)]
        return functools.reduce(operator.or_, plain)
    return kind


def setting_types() -> dict[str, Any]:
    """Each setting's type (`int | None` for an optional count)."""
    return {name: _plain(kind) for name, kind in _hints(Settings).items()}


def setting_fields() -> list[tuple[str, Any, str]]:
    """(name, type, description) of every setting, in the contract's order."""
    kinds = setting_types()
    return [(f.name, kinds[f.name], f.metadata["description"]) for f in _fields()]


def setting_defaults() -> dict[str, Any]:
    """Each setting's default; the required ones are left out."""
    return {f.name: f.default for f in _fields() if f.default is not dataclasses.MISSING}


def non_null(kind: Any) -> Any:
    """A setting's type without null: `int` of `int | None`, `bool` of `bool`."""
    if typing.get_origin(kind) not in (typing.Union, types.UnionType):
        return kind
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if len(args) == 1 else kind


def _inconsistency(s: Settings) -> str | None:
    """What makes a set of well-typed settings impossible, or None: the trainer's profile
    (`pipeline.trainers`) words what its trainer refuses."""
    from pipeline import trainers

    if s.trainer not in trainers.NAMES:
        return f"trainer: {s.trainer!r} is not a trainer; one of {', '.join(trainers.NAMES)}"
    profile = trainers.profile(s.trainer)
    foreign = [
        f.name
        for f in dataclasses.fields(s)
        if f.name not in COMMON_SETTINGS
        and f.name not in profile.settings
        and getattr(s, f.name) != f.default
    ]
    if foreign:
        return (
            f"{', '.join(foreign)}: not a setting of the {s.trainer} trainer "
            f"(its settings: {', '.join(sorted(profile.settings))})"
        )
    return profile.check(s)


def make_settings(values: Mapping[str, Any]) -> Settings:
    """Settings from plain values (files, flags, run config); a usage error names every
    problem: missing, unknown or mistyped settings first, else the first inconsistency."""
    if values.get("global_batch_size") is None and (derived := derived_global_batch_size(values)):
        values = {**values, "global_batch_size": derived}  # from num_steps_per_rollout
    try:
        return Settings(**_checked(Settings, values))
    except SettingsError as exc:
        raise UsageError(f"invalid settings: {exc}") from None


def read_config(path: str | Path | None) -> dict[str, Any]:
    """A settings file's values (`settings_files.read_config`: every setting name known)."""
    return files.read_config(path, list(setting_types()))


def setting_values(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> dict[str, Any]:
    """The settings given, files then overrides (`settings_files.stacked`)."""
    return files.stacked(config, data_configs, list(setting_types()), **overrides)


def load_settings(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> Settings:
    """Defaults below the settings given (`setting_values`), checked."""
    return make_settings(setting_values(config, data_configs, **overrides))


def make_row_settings(values: Mapping[str, Any]) -> RowSettings:
    """The row settings among `values` (the others are not checked here)."""
    try:
        return RowSettings(**_checked(RowSettings, values))
    except SettingsError as exc:
        raise UsageError(f"invalid settings: {exc}") from None
