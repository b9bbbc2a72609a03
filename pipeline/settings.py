"""The settings: those every trainer reads, and the chosen trainer's own.

`Settings` holds the common settings (`CommonSettings`: which trainer, how rows are read
and checked, the run options) and, as `own`, the chosen trainer's settings: an instance of
its settings model (`pipeline.trainers.settings_model(trainer)`, declared in its package's
`settings.py`). A trainer's setting reads as `settings.<name>` as a common one does; the
flat spelling (every setting by its one name) is how settings come in and go out: flags,
settings files, Dagster's run config, `values()`, the manifest. A setting of another
trainer given at its default is passed over; at any other value it is refused.

Every model is a frozen dataclass. A value that already has its field's exact type (as
argparse, YAML and Dagster's run config give them) is taken as it is; any other value goes
to pydantic, imported only then, which reads it in its lax mode ("yes" is true) or words
what is wrong with it. So a build with well-typed settings does not load pydantic.
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
from pipeline import trainers
from pipeline.errors import UsageError
from pipeline.setting_marks import Count, NonNegative, setting
from pipeline.setting_marks import exact as _exact
from pipeline.setting_marks import minimum as _minimum
from pipeline.setting_marks import non_null as non_null
from pipeline.setting_marks import plain as _plain
from pipeline.settings_files import DATA_SETTINGS as DATA_SETTINGS
from pipeline.settings_files import DISABLE_FLAGS as DISABLE_FLAGS
from pipeline.settings_files import data_settings_files as data_settings_files

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails


class SettingsError(ValueError):
    """Settings that cannot be used: missing, unknown or mistyped, or well-typed settings
    that cannot go together. The text names every problem on one line."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommonSettings:
    """The settings every trainer reads."""

    trainer: str = setting(
        "The trainer the shards are for: its profile (pipeline/trainers/) decides reward "
        "normalization, trimming, the DP split and the rank files.",
        trainers.NAMES[0],
    )
    dp_size: Count = setting("Data-parallel ranks, one shard file each.", 1)
    reward_key: str | None = setting("Field of a struct `reward`.", None)
    on_invalid: Literal["fail", "quarantine"] = setting(
        "`fail`: write nothing for an invalid step; `quarantine`: set invalid trajectories aside.",
        "fail",
    )
    rollout_id_policy: Literal["strict", "repair"] = setting(
        "`repair` fixes legacy rollout ids (before miles PR #2536) and counts them.", "strict"
    )
    require_success_marker: bool = setting(
        "Read a step folder only once its producer wrote step=<N>/_SUCCESS.", False
    )
    stream_above: NonNegative | None = setting(
        "MiB of input files on disk above which a step holds its per-token lists a few parts "
        "or two ranks at a time (0: every step; null: never).",
        256,
        recorded=False,
    )
    ray_address: str | None = setting("Ray cluster's GCS, or auto.", None, recorded=False)
    ray_above: NonNegative = setting("MiB above which a step goes to Ray.", 256, recorded=False)

    @property
    def stream_above_bytes(self) -> int | None:
        return None if self.stream_above is None else self.stream_above << 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSettings:
    """What reading and checking rows needs of the settings: a projection of `Settings`
    (`Settings.rows()`), which `validate` without a batch runs on."""

    trainer: str = trainers.NAMES[0]
    reward_key: str | None = None
    on_invalid: str = "fail"
    rollout_id_policy: str = "strict"
    require_success_marker: bool = False
    normalizes_rewards: bool = True  # the trainer's reading of its own settings
    ray_address: str | None = None  # `validate --ray`: the checks run as tasks there
    ray_above: int = 256
    # input columns the trainer's settings have it ignore (miles' legacy_weight_versions)
    dropped_columns: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, init=False)
class Settings(CommonSettings):
    """Effective settings of one build; shared by the CLI, the Dagster run config and tests.

    Made from flat values (`Settings(global_batch_size=8, dp_size=2)`) and checked when
    made: each value against its field's type (integers strictly, booleans and texts in
    pydantic's lax mode), then the trainer's profile on the whole (SettingsError).
    `make_settings` words every problem as one usage line."""

    own: Any = None  # the trainer's settings model, filled from the flat values

    def __init__(self, **values: Any) -> None:
        common, own = _built(values)
        for name, value in common.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "own", own)
        if (problem := trainers.profile(self.trainer).check(self)) is not None:
            raise SettingsError(problem)

    def __getattr__(self, name: str) -> Any:
        # only reached for a name that is not a common setting: the trainer's own
        if name.startswith("__") or "own" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["own"], name)

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, checked as the settings are when made."""
        return Settings(**{**self.values(), **changes})

    def values(self) -> dict[str, Any]:
        """Every setting of this trainer by name, run options included (what a worker is
        handed), the common ones first."""
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(CommonSettings)}
        return common | {f.name: getattr(self.own, f.name) for f in dataclasses.fields(self.own)}

    def to_dict(self) -> dict[str, Any]:
        """Every recorded setting of this trainer by name, as JSON values (the manifest's
        `settings`): the run options, which change no output byte, are left out."""
        fields = [*dataclasses.fields(CommonSettings), *dataclasses.fields(self.own)]
        return {f.name: getattr(self, f.name) for f in fields if f.metadata.get("recorded", True)}

    def to_json(self) -> str:
        """The settings as compact JSON, as the rerun digests hash them."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    def rows(self) -> RowSettings:
        """What reading and checking rows needs of these settings."""
        return RowSettings(
            trainer=self.trainer,
            reward_key=self.reward_key,
            on_invalid=self.on_invalid,
            rollout_id_policy=self.rollout_id_policy,
            require_success_marker=self.require_success_marker,
            normalizes_rewards=self.own.normalizes_rewards,
            ray_address=self.ray_address,
            ray_above=self.ray_above,
            # a trainer whose model has no such setting drops nothing
            dropped_columns=getattr(self.own, "dropped_columns", ()),
        )


# CommonSettings or a trainer's settings model (a plain `type`, which the caches key on).
Model = type
COMMON_SETTINGS = frozenset(f.name for f in dataclasses.fields(CommonSettings))


def _built(values: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """The checked common settings among `values` and the trainer's own settings model
    made of the rest; SettingsError naming every unknown, missing or mistyped one, else
    every setting of another trainer given at another value than its default."""
    known = _every_field()
    problems: list[str] = []
    common: dict[str, Any] = {}
    try:
        common = _checked(CommonSettings, _among(CommonSettings, values))
    except SettingsError as exc:
        problems.append(str(exc))
    trainer = common.get("trainer", values.get("trainer", CommonSettings.trainer))
    own: dict[str, Any] = {}
    if not isinstance(trainer, str) or trainer not in trainers.NAMES:
        if "trainer" in common:  # else mistyped, and told above
            one_of = ", ".join(trainers.NAMES)
            problems.append(f"trainer: {trainer!r} is not a trainer; one of {one_of}")
    else:
        model = trainers.settings_model(trainer)
        try:
            own = _checked(model, _among(model, values))
        except SettingsError as exc:
            problems.append(str(exc))
    unknown = [name for name in values if name not in known]
    if unknown:  # worded as pydantic words them, after the fields (as it does)
        from pipeline.yaml_config import setting_name

        problems += [f"{setting_name(name)}: Extra inputs are not permitted" for name in unknown]
    if problems:
        raise SettingsError("; ".join(problems))
    read = {f.name for f in dataclasses.fields(model)}
    foreign = [
        name
        for name, value in values.items()
        if name not in COMMON_SETTINGS and name not in read and value != known[name].default
    ]
    if foreign:
        raise SettingsError(
            f"{', '.join(foreign)}: not a setting of the {trainer} trainer "
            f"(its settings: {', '.join(sorted(read))})"
        )
    return {**_defaults(CommonSettings), **common}, model(**own)


def _among(model: Model, values: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(model)}
    return {name: value for name, value in values.items() if name in names}


@functools.cache
def _defaults(model: Model) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(model)}


@functools.cache
def _every_field() -> dict[str, dataclasses.Field[Any]]:
    """Every setting's field by name, in the contract's order: the common settings, then
    each trainer's own (`trainers.NAMES` order) that no trainer before it declared."""
    fields = {f.name: f for f in dataclasses.fields(CommonSettings)}
    for name in trainers.NAMES:
        for f in dataclasses.fields(trainers.settings_model(name)):
            fields.setdefault(f.name, f)
    return fields


@functools.cache
def _every_kind() -> dict[str, Any]:
    """Every setting's type as annotated, by name (a count keeps its mark)."""
    kinds = dict(_hints(CommonSettings))
    for name in trainers.NAMES:
        for field, kind in _hints(trainers.settings_model(name)).items():
            kinds.setdefault(field, kind)
    return {name: kinds[name] for name in _every_field()}


@functools.cache
def _hints(model: Model) -> dict[str, Any]:
    """Each field's type as annotated (a count keeps its mark)."""
    return typing.get_type_hints(model, include_extras=True)


def _checked(model: Model, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (each a field of `model`) checked; SettingsError naming every mistyped
    one, worded by pydantic."""
    kinds = _hints(model)
    if beyond := [f"{name}: the integer {v} is beyond int64" for name, v in _ints(values)]:
        raise SettingsError("; ".join(beyond))  # wherever it came from (a file refuses it too)
    if all(_exact(kinds[k], v) for k, v in values.items()):
        return dict(values)
    from pydantic import ValidationError

    try:
        checked = _pydantic_model(model).model_validate(values)
        return {name: getattr(checked, name) for name in values}
    except ValidationError as exc:
        raise SettingsError("; ".join(_problem(error) for error in exc.errors())) from None


def _ints(values: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The integers of `values` (lists' included) beyond int64, by setting."""
    found = []
    for name, value in values.items():
        for item in value if type(value) is list else [value]:
            if type(item) is int and not -(1 << 63) <= item < 1 << 63:
                found.append((name, item))
    return found


@functools.cache
def _pydantic_model(model: Model) -> type[BaseModel]:
    """A pydantic model of `model`'s fields: a count strict and at least 1, booleans and
    texts lax (what is not its field was told apart before)."""
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
    return create_model(model.__name__, __config__=ConfigDict(extra="ignore"), **fields)


def _problem(error: ErrorDetails) -> str:
    """One of pydantic's errors as `name: what is wrong`."""
    from pipeline.yaml_config import setting_name

    name = ".".join(map(setting_name, error["loc"]))
    if error["type"] == "missing":  # pydantic's "Field required", in the project's words
        return f"{name}: required: give it as a flag, in --config or in rollout-shards.yaml"
    return f"{name}: {error['msg']}"


def valued_booleans() -> frozenset[str]:
    """Booleans named after a trainer's configuration keys, given a value as there
    (`--balance-batch false`)."""
    kinds = setting_types()
    return frozenset(
        name
        for name, f in _every_field().items()
        if f.metadata.get("valued") and kinds[name] is bool
    )


def setting_types() -> dict[str, Any]:
    """Each setting's type (`int | None` for an optional count)."""
    return {name: _plain(kind) for name, kind in _every_kind().items()}


def setting_fields() -> list[tuple[str, Any, str]]:
    """(name, type, description) of every setting, in the contract's order."""
    kinds = setting_types()
    return [(name, kinds[name], f.metadata["description"]) for name, f in _every_field().items()]


def setting_defaults() -> dict[str, Any]:
    """Each setting's default; the required ones are left out."""
    return {
        name: f.default
        for name, f in _every_field().items()
        if f.default is not dataclasses.MISSING
    }


def readers_of(name: str) -> list[str]:
    """The trainers that read the setting `name` (every trainer reads a common one)."""
    if name in COMMON_SETTINGS:
        return list(trainers.NAMES)
    return [t for t in trainers.NAMES if name in _defaults(trainers.settings_model(t))]


def make_settings(values: Mapping[str, Any], sources: Mapping[str, str] = {}) -> Settings:
    """Settings from plain values (files, flags, run config); a usage error names every
    problem: missing, unknown or mistyped settings first, else the first inconsistency;
    each setting it names is followed by where it was given (`sources`)."""
    trainer = values.get("trainer", CommonSettings.trainer)
    if trainer in trainers.NAMES:  # settings the trainer derives from the others given
        values = {**values, **trainers.settings_model(trainer).derived(values)}
    try:
        return Settings(**values)
    except SettingsError as exc:
        raise UsageError(f"invalid settings: {files.sourced(str(exc), sources)}") from None


def _sections() -> dict[str, list[str]]:
    """Each trainer's section of a settings file: its name and the settings it holds
    (the common ones and the trainer's own)."""
    common = list(COMMON_SETTINGS - {"trainer"})
    return {name: [*common, *_defaults(trainers.settings_model(name))] for name in trainers.NAMES}


def read_config(path: str | Path | None) -> dict[str, Any]:
    """A settings file's values (`settings_files.read_config`: every setting name known,
    and a section per trainer)."""
    return files.read_config(path, list(setting_types()), _sections())


def given_settings(
    config: str | Path | None = None,
    data_configs: Sequence[Path] = (),
    unset: Sequence[str] = (),
    source: str = "flag --{dashed}",
    **overrides: Any,
) -> files.Given:
    """The settings given and where each came from, files then overrides, less those
    `unset` (`settings_files.stacked`)."""
    return files.stacked(
        config,
        data_configs,
        list(setting_types()),
        _sections(),
        unset,
        source,
        CommonSettings.trainer,
        **overrides,
    )


def setting_values(
    config: str | Path | None = None, data_configs: Sequence[Path] = (), **overrides: Any
) -> dict[str, Any]:
    """The settings given, files then overrides (`given_settings`)."""
    return given_settings(config, data_configs, **overrides).values


def load_settings(
    config: str | Path | None = None,
    data_configs: Sequence[Path] = (),
    unset: Sequence[str] = (),
    source: str = "flag --{dashed}",
    **overrides: Any,
) -> Settings:
    """Defaults below the settings given (`given_settings`), checked."""
    given = given_settings(config, data_configs, unset, source, **overrides)
    return make_settings(given.values, given.sources)


def make_row_settings(
    values: Mapping[str, Any], sources: Mapping[str, str] = {}
) -> RowSettings | None:
    """The row settings of `values` when the trainer cannot check its batch with them
    (`validate` then checks the rows alone: miles without a global batch size), after
    checking every other setting as `build` would, with the trainer's stand-in for what is
    missing; None when the batch can be checked (`make_settings`)."""
    trainer = values.get("trainer", CommonSettings.trainer)
    if trainer not in trainers.NAMES:
        make_settings(values, sources)  # words the trainer's name
    stand_in = trainers.settings_model(trainer).batch_stand_in(values)
    if stand_in is None:
        return None
    return make_settings({**values, **stand_in}, sources).rows()
