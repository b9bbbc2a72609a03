"""The rules across rows verl's profile holds a step's rows to: every rule of
`schemas.rules.ROWS` (verl itself checks none; its rows are built from them)."""

from __future__ import annotations

from pipeline.schemas.rules import ROWS, Model

ROW_RULES: Model = ROWS
