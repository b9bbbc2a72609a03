"""The settings are checked without pydantic, in pydantic's words: a differential test
against a pydantic model built from the same fields (pydantic comes with Dagster)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from pipeline.errors import UsageError
from pipeline.settings import Settings, _parse_fields, make_settings, setting_fields


def _pydantic_model() -> type[BaseModel]:
    """The settings as a pydantic model, as they were declared before: integers strict
    with their lower bound, everything else in pydantic's lax mode, no unknown names."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        kind = next(t for name, t, _ in setting_fields() if name == f.name)
        default = ... if f.default is dataclasses.MISSING else f.default
        ge = f.metadata["ge"]
        fields[f.name] = (kind, Field(default, ge=ge, strict=True) if ge else Field(default))
    config = ConfigDict(extra="forbid", frozen=True)
    model: type[BaseModel] = create_model("PydanticSettings", __config__=config, **fields)
    return model


PYDANTIC = _pydantic_model()
CANDIDATES: list[Any] = [
    8, 1, 0, -3, 2**70, True, False, 8.0, 1.0, 0.0, 0.5, 2.0, float("nan"), "8", "yes", "No",
    "TRUE", " on", "", "maybe", "grpo", "ppo", "quarantine", "repair", "v2", b"yes", b"key",
    None, [], {}, [1],
]  # fmt: skip


def _pydantic(values: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    try:
        return PYDANTIC(**values).model_dump(), []
    except ValidationError as exc:
        return None, [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Settings)])
def test_each_setting_reads_every_value_as_pydantic_did(name: str) -> None:
    for value in CANDIDATES:
        values = {"global_batch_size": 8, name: value}
        dumped, expected = _pydantic(values)
        parsed, problems = _parse_fields(values)
        assert problems == expected, (name, value)
        if dumped is not None:
            assert {k: dumped[k] for k in parsed} == parsed, (name, value)
            assert [type(dumped[k]) for k in parsed] == [type(v) for v in parsed.values()]


def test_missing_and_unknown_settings_are_worded_as_pydantic_did() -> None:
    for values in [{}, {"dp_size": "x", "gbs": 1}, {"global_batch_size": 4, "Dp_size": 2}]:
        assert _parse_fields(values)[1] == _pydantic(values)[1], values


def test_make_settings_names_every_problem_then_the_inconsistency() -> None:
    with pytest.raises(UsageError) as excinfo:
        make_settings({"dp_size": "8", "balance_data": "maybe", "foo": 1})
    assert str(excinfo.value) == (
        "invalid settings: global_batch_size: Field required; dp_size: Input should be a "
        "valid integer; balance_data: Input should be a valid boolean, unable to interpret "
        "input; foo: Extra inputs are not permitted"
    )
    with pytest.raises(UsageError) as excinfo:
        make_settings({"global_batch_size": 6, "dp_size": 4})
    assert str(excinfo.value).startswith(
        "invalid settings: global_batch_size=6 must be divisible by dp_size=4"
    )
    assert make_settings({"global_batch_size": 8, "balance_data": "yes"}).balance_data is True


def test_settings_are_frozen_and_checked_when_replaced() -> None:
    settings = Settings(global_batch_size=8, dp_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.dp_size = 4  # type: ignore[misc]
    assert dataclasses.replace(settings, global_batch_size=4).global_batch_size == 4
    with pytest.raises(ValueError, match="must be divisible"):
        dataclasses.replace(settings, global_batch_size=3)
    assert settings.to_json().startswith('{"global_batch_size":8,"dp_size":2,')
