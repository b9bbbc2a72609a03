"""The rules across rows miles holds a step's rows to: every rule of `schemas.rules.ROWS`
(which were written after miles' own checks, rollout ids included)."""

from __future__ import annotations

from pipeline.schemas.rules import ROWS, Model

ROW_RULES: Model = ROWS
