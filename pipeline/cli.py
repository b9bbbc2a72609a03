"""The command line: `rollout-shards build`, `validate`, `parity` and `metrics`
(CONTRACT section 4).

This module parses the arguments and imports only the standard library and the settings;
the commands themselves (`pipeline.commands`, Polars with them) load once the arguments
are known, after `main` has set the process settings a build wants
(`pipeline.speed.tune_process`), while the head start hashes the inputs
(`pipeline.speed.HeadStart`). It runs the same driver as the Dagster assets and never
imports Dagster.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pipeline.errors import StepError, UsageError, os_violation, printable
from pipeline.io.storage import ObjectRoot, root_of
from pipeline.settings import DISABLE_FLAGS, non_null, setting_fields, valued_booleans
from pipeline.speed import HeadStart, on, tune_process
from pipeline.streams import (
    end_on_interrupt,
    exit_now,
    kept_streams,
    program_streams_and_signals,
)
from pipeline.trainers import flag_readers

PROG = "rollout-shards"


# Values a user may give a switch, which takes none (`--balance-data true`).
_SWITCH_VALUES = frozenset(("true", "false", "yes", "no", "on", "off", "1", "0"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: usage error: {message} (see {PROG} --help)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """The arguments, with a settings file's spelling of a flag taken
        (`--global_batch_size` for `--global-batch-size`); a switch given a value, or a
        flag no command has, is a usage error naming the flag meant."""
        flags = self._command_flags()
        argv = [_dashed(arg, flags) for arg in (sys.argv[1:] if args is None else args)]
        _no_switch_values(argv, flags)
        parsed, extras = self.parse_known_args(argv)
        if extras:
            self.error(_unrecognized(extras, flags.get(getattr(parsed, "command", None), {})))
        return parsed

    def _command_flags(self) -> dict[str | None, dict[str, argparse.Action]]:
        """Each command's flags (by option string), and every flag under None."""
        found: dict[str | None, dict[str, argparse.Action]] = {None: {}}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    found[command] = dict(sub._option_string_actions)
                    found[None].update(sub._option_string_actions)
        return found


def _dashed(arg: str, flags: dict[str | None, dict[str, argparse.Action]]) -> str:
    """`--global_batch_size[=V]` as `--global-batch-size[=V]` when that is a flag."""
    name, equals, value = arg.partition("=")
    dashed = name.replace("_", "-")
    return dashed + equals + value if arg.startswith("--") and dashed in flags[None] else arg


def _no_switch_values(argv: list[str], flags: dict[str | None, dict[str, argparse.Action]]) -> None:
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        action = flags[None].get(name)
        if action is None or action.nargs != 0 or not name.startswith("--"):
            continue
        given = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
        if equals or (given.lower() in _SWITCH_VALUES and not os.path.exists(given)):
            raise SystemExit(
                _usage(f"{name} is a switch and takes no value ({given!r}): give {name} alone")
            )


def _usage(message: str) -> int:
    print(f"{PROG}: usage error: {message} (see {PROG} --help)", file=sys.stderr)
    return 2


def _unrecognized(extras: list[str], flags: dict[str, argparse.Action]) -> str:
    """`unrecognized arguments: ...`, naming the closest flag of the command for each
    flag it does not have."""
    from pipeline.spelling import closest

    near = {
        arg: found
        for arg in extras
        if arg.startswith("-") and (found := closest(arg.partition("=")[0], flags)) is not None
    }
    if len(near) == 1:
        meant = f": did you mean {next(iter(near.values()))}?"
    elif near:
        meant = ": did you mean " + ", ".join(f"{f} (for {a})" for a, f in near.items()) + "?"
    else:
        meant = ""
    return f"unrecognized arguments: {' '.join(extras)}{meant}"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# A setting's flag besides the one named after it.
SHORT_FLAGS = {"ray_address": ("--ray",)}


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (override the config file; named as miles' flags)")
    group.add_argument(
        "--unset",
        metavar="NAME",
        action="append",
        default=[],
        help="drop the value a settings file gives the setting NAME (back to its default); "
        "repeatable",
    )
    valued = valued_booleans()
    readers = flag_readers()
    for name, annotation, help_text in setting_fields():
        if name in DISABLE_FLAGS:
            _add_setting(group, name, f"turn off {name}", DISABLE_FLAGS[name], action="store_false")
            continue
        base = non_null(annotation)
        how: dict[str, Any]
        if name in valued:
            # a text the settings model reads as a boolean ("true", "false", "yes", ...)
            how = {"metavar": "true|false"}
        elif name in readers or typing.get_origin(base) is list:
            _add_shaped_flag(group, name, base, help_text)
            continue
        elif base is bool:
            how = {"action": "store_true"}
        elif typing.get_origin(base) is typing.Literal:
            how = {"choices": typing.get_args(base)}
        else:
            how = {"type": typing.cast(Callable[[str], Any], base), "metavar": name.upper()}
        _add_setting(group, name, help_text, **how)


def _add_setting(
    group: argparse._ArgumentGroup, name: str, help_text: str, flag: str = "", **how: Any
) -> None:
    """The flag of setting `name` (`flag`, else the name's; and its SHORT_FLAGS), absent
    from the namespace unless given, so that only what the command line says overrides."""
    flags = (_flag(flag or name), *SHORT_FLAGS.get(name, ()))
    group.add_argument(*flags, dest=name, default=argparse.SUPPRESS, help=help_text, **how)


def _add_shaped_flag(group: argparse._ArgumentGroup, name: str, base: Any, help_text: str) -> None:
    """A setting whose value is not one scalar: a list (`--ft-components rollout train`,
    miles' nargs) or a value read by its own reader (`--moe-layer-freq ([0]+[1]*3)`)."""
    readers = flag_readers()
    if name in readers:

        def reader(text: str) -> Any:
            try:
                return readers[name](text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        _add_setting(group, name, help_text, type=reader, metavar=name.upper())
        return
    (item,) = typing.get_args(base)
    choices = typing.get_args(item) if typing.get_origin(item) is typing.Literal else None
    _add_setting(group, name, help_text, nargs="+", choices=choices)


# The layout settings `plan` takes as comma lists (`--dp-size 8,16,32`): each combination
# of their values is one layout of the grid.
GRID_SETTINGS = (
    "dp_size",
    "cp_size",
    "max_tokens_per_gpu",
    "micro_batch_size",
    "global_batch_size",
    "vpp_size",
    "microbatch_group_size_per_vp_stage",
)


def grid_argvs(argv: list[str]) -> tuple[list[list[str]], list[str]]:
    """`plan`'s arguments as one argument list per layout of the grid, and the settings
    that vary (in the order given)."""
    flags = {_flag(name): name for name in GRID_SETTINGS}
    variants: list[list[str]] = [[]]
    varying: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        flag, equals, value = token.partition("=")
        if flag in flags and not equals:
            value = next(tokens, "")
        if flag in flags and "," in value:
            values = [v.strip() for v in value.split(",")]
            varying.append(flags[flag])
            variants = [[*v, flag, item] for v in variants for item in values]
        elif flag in flags:
            variants = [[*v, flag, value] for v in variants]
        else:
            variants = [[*v, token] for v in variants]
    return variants, varying


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown (not installed)"


class _Version(argparse.Action):
    """`--version`: the installed version, looked up only when asked (reading the package's
    metadata would delay every command)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _root(text: str) -> Path | ObjectRoot:
    """A root argument: a folder, or an object store's URL (`storage.root_of`)."""
    try:
        return root_of(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    root = _Parser(prog=PROG, description="Validated training shards from RL rollout tables.")
    root.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    commands = root.add_subparsers(dest="command", required=True, parser_class=_Parser)
    build = commands.add_parser("build", help="write training shards for every step found")
    build.add_argument("inputs", nargs="+", metavar="INPUT")
    build.add_argument(
        "--out", required=True, type=_root, help="output root (a folder, s3:// or gs://)"
    )
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild steps whose folder is already current (same inputs and settings)",
    )
    validate = commands.add_parser("validate", help="check inputs and settings, write nothing")
    validate.add_argument("inputs", nargs="+", metavar="INPUT")
    validate.add_argument("--format", choices=("text", "json"), default="text")
    plan = commands.add_parser(
        "plan", help="each rank's load of every step under a grid of layouts, write nothing"
    )
    plan.add_argument("inputs", nargs="+", metavar="INPUT")
    plan.add_argument("--format", choices=("text", "json"), default="text")
    plan.add_argument(
        "--by",
        # `planner.MEASURES`, named here: the planner loads Polars, after the process settings
        choices=("tokens", "sum_squared_lengths", "flops", "micro_batches", "padding"),
        help="the imbalance the best layout is chosen by (default: flops where the model's "
        "shape is given, else sum_squared_lengths)",
    )
    for sub in (build, validate, plan):
        sub.add_argument("--config", type=Path, help="settings YAML")
        sub.add_argument(
            "--session-version",
            choices=("v1", "v2"),
            help="session version of every row of miles .pt dumps (they do not store it)",
        )
        _add_setting_flags(sub)
        sub.add_argument(
            "--quiet",
            action="store_true",
            help="no progress bar on a terminal (stdout keeps its lines)",
        )
        sub.set_defaults(early_digests=None)  # `HeadStart.digest` when run by `main`
    compare = commands.add_parser(
        "parity", help="compare two builds or two inputs field by field, bitwise"
    )
    compare.add_argument("left", metavar="A", help="output root, step folder or input")
    compare.add_argument("right", metavar="B", help="the same kind as A")
    compare.add_argument("--format", choices=("text", "json"), default="text")
    metrics = commands.add_parser(
        "metrics", help="export every committed step's rollout metrics (docs/metrics.md)"
    )
    metrics.add_argument(
        "root", type=_root, metavar="ROOT", help="output root of build (a folder, s3://)"
    )
    metrics.add_argument("--tensorboard", type=Path, metavar="DIR", help="event file folder")
    metrics.add_argument("--jsonl", metavar="FILE", help="JSON Lines file, - for stdout")
    report = commands.add_parser(
        "report", help="an HTML index of every committed step's report, with trends"
    )
    report.add_argument("root", type=_root, metavar="ROOT", help="output root of build")
    report.add_argument("--out", type=Path, metavar="FILE", help="default: ROOT/report.html")
    report.add_argument(
        "--serve",
        action="store_true",
        help="serve ROOT's reports and its index over HTTP (read-only) until Ctrl-C",
    )
    report.add_argument("--host", default="127.0.0.1", help="--serve's address (127.0.0.1)")
    report.add_argument("--port", type=int, default=3001, help="--serve's port (3001)")
    return root


def _run(
    args: argparse.Namespace, head_start: HeadStart | None = None, program: bool = False
) -> int:
    from pipeline import commands  # Polars and the stages: after the process settings

    if program:
        end_on_interrupt()  # again: importing Polars installed its own SIGINT handler

    if head_start is not None:
        head_start.loaded()

    try:
        return commands.COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"{PROG}: usage error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except StepError as exc:
        commands.print_violations(args.command, exc.violations)
        return 1
    except OSError as exc:
        commands.print_violations(
            args.command, [os_violation(exc, Path(getattr(args, "out", None) or "."))]
        )
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """The program (`rollout-shards`). Called with `argv` it returns the exit status (tests,
    other Python code); as the program itself (no `argv`) it exits when done. Output that
    cannot be written (a closed stdout, a reader gone) is dropped and changes nothing else."""
    if argv is None:
        program_streams_and_signals()
    tune_process()
    with kept_streams():
        given = list(sys.argv[1:] if argv is None else argv)
        variants, varying = grid_argvs(given) if given[:1] == ["plan"] else ([given], [])
        args = parser().parse_args(variants[0])
        if args.command == "plan":
            args.varying = varying
            args.layouts = [args, *(parser().parse_args(v) for v in variants[1:])]
        head_start = None
        # a build on a Ray cluster reads its files there: the head start would read them here
        on_ray = getattr(args, "ray_address", None) is not None
        if args.command in ("build", "validate") and on("head_start") and not on_ray:
            head_start = HeadStart(args.inputs)
            args.early_digests = head_start.digest
        status = _run(args, head_start, program=argv is None)
        if argv is None:
            exit_now(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
