"""The README names only what exists: every repository path and module it mentions, and
every `docs/*.md` it links to."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

# Top-level folders of the project: a path in the README starting with one of these (or with
# any other entry of the repository root) names a repository path and must exist.
PROJECT_ROOTS = frozenset({"pipeline", "tests", "bench", "docs", "data", "loader", ".ci"})


FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE = re.compile(r"(?:python -m )?(pipeline(?:\.\w+)+)")
# A span holding a placeholder, a glob or a variable is a pattern, not a path.
PATTERN = re.compile(r"[<>*{}$=\s]")


def prose(text: str) -> str:
    """The README without its fenced blocks (commands and sample output, not references)."""
    return FENCE.sub("", text)


def ignored_entries(repo: Path) -> list[str]:
    """The plain entries of .gitignore: folders a command writes, never part of the repo."""
    gitignore = repo / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    return [line.strip().strip("/") for line in lines if line.strip() and "*" not in line]


def named_paths(text: str, repo: Path) -> list[str]:
    """Repository paths named in backticks or as link targets."""
    roots = PROJECT_ROOTS | {entry.name for entry in repo.iterdir()}
    spans = INLINE_CODE.findall(prose(text)) + LINK.findall(prose(text))
    paths = []
    for span in spans:
        path = span.split("#")[0].removeprefix("./")
        if not path or "://" in path or PATTERN.search(path) or "/" not in path:
            continue
        if path.split("/")[0] in roots:
            paths.append(path)
    return paths


def layout_paths(text: str) -> list[str]:
    """The paths of the Layout section's tree: names left of a two-space gap, an indented
    name inside the folder above it."""
    section = text.partition("\n## Layout\n")[2]
    block = FENCE.search(section)
    if not block:
        return []
    paths, folder = [], ""
    for line in block.group(0).splitlines()[1:-1]:
        names = line.strip().split("  ")[0].split()
        indented = line.startswith(" ")
        for name in names:
            paths.append(folder + name if indented else name)
            if not indented and name.endswith("/"):
                folder = name
    return paths


def named_modules(text: str) -> list[str]:
    """Dotted modules of the package named in backticks (`pipeline.definitions`)."""
    spans = INLINE_CODE.findall(prose(text))
    return [m.group(1) for span in spans if (m := MODULE.fullmatch(span))]


def missing_paths(text: str, repo: Path) -> list[str]:
    """Named paths that do not exist, leaving out generated folders and pending docs."""
    generated = ignored_entries(repo)
    missing = []
    for path in named_paths(text, repo) + layout_paths(text):
        bare = path.rstrip("/")
        if any(bare == entry or bare.startswith(entry + "/") for entry in generated):
            continue
        if (repo / bare).exists():
            continue
        missing.append(path)
    return missing


def missing_modules(text: str, repo: Path) -> list[str]:
    missing = []
    for module in named_modules(text):
        base = repo.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            missing.append(module)
    return missing


def broken_doc_links(text: str, repo: Path) -> list[str]:
    """Links to docs/*.md that lead nowhere (pending docs of other branches aside)."""
    targets = [t.split("#")[0].removeprefix("./") for t in LINK.findall(text)]
    return [
        t
        for t in targets
        if t.startswith("docs/") and t.endswith(".md") and not (repo / t).is_file()
    ]


def test_every_path_the_readme_names_exists() -> None:
    assert missing_paths(README.read_text(), REPO) == []


def test_every_module_the_readme_names_exists() -> None:
    assert missing_modules(README.read_text(), REPO) == []


def test_every_docs_link_of_the_readme_resolves() -> None:
    assert broken_doc_links(README.read_text(), REPO) == []


def test_the_readme_links_the_project_docs() -> None:
    linked = {t.split("#")[0] for t in LINK.findall(README.read_text())}
    for name in ("contract", "semantics", "dagster", "scaling-out", "bad-data", "parity", "miles"):
        assert f"docs/{name}.md" in linked
        assert (REPO / "docs" / f"{name}.md").is_file()


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 155


def test_the_checks_find_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "pipeline" / "step").mkdir(parents=True)
    (tmp_path / "pipeline" / "step" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "cli.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "contract.md").write_text("# Contract\n")
    (tmp_path / ".gitignore").write_text("data/shards/\n*.egg-info/\n")
    text = "\n".join(
        [
            "See `pipeline/step/`, `pipeline/cli.py`, `pipeline/gone.py` and `docs/nope/`.",
            "Run `python -m pipeline.cli` or `pipeline.step`, not `pipeline.absent`.",
            "Output in `data/shards/`, files `step=<N>/rank=<R>.parquet`, metric",
            "`rollout/response_len/mean`, `list<int32>`, <https://example.org/x/y>.",
            "[contract](docs/contract.md), [semantics](docs/semantics.md#rules),",
            "[training](docs/training.md), [ext](https://example.org/docs/a.md).",
            "```",
            "ls pipeline/not-checked-in-a-fence.py `pipeline/fenced.py`",
            "```",
            "## Layout",
            "```",
            "pipeline/         the package",
            "  cli.py step/    the CLI (`pipeline/described.py` is not a name)",
            "  lost.py         gone",
            "docs/             docs",
            "Makefile          the targets",
            "```",
        ]
    )
    assert missing_paths(text, tmp_path) == [
        "pipeline/gone.py",
        "docs/nope/",
        "docs/semantics.md",
        "docs/training.md",
        "pipeline/lost.py",
        "Makefile",
    ]
    assert missing_modules(text, tmp_path) == ["pipeline.absent"]
    assert broken_doc_links(text, tmp_path) == ["docs/semantics.md", "docs/training.md"]


# docs/performance.md: a guide to the benchmarks, its dated runs kept in bench/results/.
PERFORMANCE = REPO / "docs" / "performance.md"
RESULTS = REPO / "bench" / "results"
RUN_MARKERS = ("<!-- bench/run.py: begin -->", "<!-- bench/run.py: end -->")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
BENCH_SCRIPT = re.compile(r"(?:bench/(\w+)\.py|-m bench\.(\w+))")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_anchors(text: str, source: Path) -> list[str]:
    """Links `file.md#section` (relative to `source`) whose file has no such heading."""
    broken = []
    for target in LINK.findall(text):
        path, _, section = target.partition("#")
        if not section or "://" in path or not path.endswith(".md"):
            continue
        doc = (source.parent / path).resolve()
        headings = {anchor(h) for h in HEADING.findall(doc.read_text())} if doc.is_file() else set()
        if section not in headings:
            broken.append(target)
    return broken


def missing_names(text: str, repo: Path) -> list[str]:
    """Dotted names of the package in backticks that are neither a module nor a name a
    module defines at its top level (`pipeline.speed.tune_process`)."""
    missing = []
    for dotted in named_modules(text):
        parts = dotted.split(".")
        module, attribute = repo.joinpath(*parts[:-1]).with_suffix(".py"), parts[-1]
        defined = module.is_file() and re.search(
            rf"^(?:def |class )?{attribute}\b", module.read_text(), re.MULTILINE
        )
        if not (missing_modules(f"`{dotted}`", repo) == [] or defined):
            missing.append(dotted)
    return missing


def test_the_performance_guide_is_short_and_holds_no_diary() -> None:
    text = PERFORMANCE.read_text()
    assert len(text.splitlines()) <= 200
    dated = [h for h in HEADING.findall(text) if DATE.search(h)]
    assert dated == []


def test_the_performance_guide_names_what_exists() -> None:
    text = PERFORMANCE.read_text()
    assert missing_paths(text, REPO) == []
    assert missing_names(text, REPO) == []
    scripts = {a or b for a, b in BENCH_SCRIPT.findall(text)}
    assert {"run", "ab", "backends", "loader", "bench_schedule"} <= scripts
    assert [s for s in scripts if not (REPO / "bench" / f"{s}.py").is_file()] == []


def test_bench_run_finds_its_markers_in_the_results() -> None:
    text = (RESULTS / "build.md").read_text()
    begin, end = RUN_MARKERS
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text.index(begin) < text.index(end)


# A tracker's number (`issue 33`, `(issues 6, 13)`) or a date; miles' PRs (`miles PR #2536`)
# name the peer's code and stay.
DIARY = re.compile(r"\bissues? \d+|\d{4}-\d{2}-\d{2}|\b(?:19|20)\d{2}-\d{2}\b")


def test_the_docs_keep_no_dated_runs_or_tracker_numbers() -> None:
    """Docs are a guide: dated runs and tracker numbers live in bench/results/."""
    sources = [README, REPO / "loader" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = {
        f"{source.relative_to(REPO)}:{number}": line
        for source in sources
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if DIARY.search(line)
    }
    assert found == {}


# A path of the machine the project was written on; `/tmp/...` in a record of a run is not.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|Users)/")
MACHINE_SUFFIXES = (".py", ".md", ".toml", ".yaml", ".yml", ".json", ".cfg", ".txt", ".sh")


def test_nothing_names_a_path_of_this_machine() -> None:
    """A fresh clone on another machine runs as it is: no file names a folder of the
    machine it was written on (the tests get peers' source from an env variable or a
    clone of the public URL)."""
    # the files of the repository (git's), not what a build or a test left beside them
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    files = [
        REPO / name
        for name in sorted(tracked.split("\0"))
        if name
        and (
            name in ("README.md", "Makefile", "pyproject.toml")
            or Path(name).suffix in MACHINE_SUFFIXES
        )
        and name.split("/")[0] in ("docs", "tests", "pipeline", "loader", "bench", "data", name)
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert found == []


def test_the_machine_path_check_finds_one() -> None:
    named = [f"cd {'/'}work/main", f"'{'/'}home/me/x'", f"({'/'}Users/a/b)"]
    kept = ["/tmp/bench33/work/inputs", "~/.cache/rollout-shards", "$HOME/x", "a/work/b"]
    assert [bool(MACHINE_PATH.search(s)) for s in named + kept] == [True] * 3 + [False] * 4


def test_links_to_sections_of_the_docs_resolve() -> None:
    sources = [README, *sorted((REPO / "docs").glob("*.md"))]
    assert {str(s.name): broken_anchors(s.read_text(), s) for s in sources} == {
        str(s.name): [] for s in sources
    }


def test_the_dated_runs_are_records_of_runs() -> None:
    files = sorted(RESULTS.glob("*.json"))
    assert files
    for file in files:
        record = json.loads(file.read_text())
        day = DATE.match(file.stem)
        assert day, file.name  # <date>.json, or <date>-<what>.json for one measurement
        if file.stem != day.group():
            assert {"what", "command"} & record.keys(), file.name
            continue
        assert record["date"] == file.stem
        for run in record["runs"]:
            assert {"time", "commit", "command", "load", "figures"} <= run.keys()
            assert re.fullmatch(r"\d{2}:\d{2}", run["time"])


def test_the_anchor_check_finds_a_missing_section(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## The shards' Parquet options\n")
    text = "[x](a.md#the-shards-parquet-options) [y](a.md#gone) [z](b.md#any) [w](a.md)"
    assert broken_anchors(text, tmp_path / "README.md") == ["a.md#gone", "b.md#any"]


def test_the_name_check_finds_what_is_not_defined(tmp_path: Path) -> None:
    (tmp_path / "pipeline" / "io").mkdir(parents=True)
    (tmp_path / "pipeline" / "io" / "writer.py").write_text("OPTIONS = {}\ndef seal(): ...\n")
    text = "`pipeline.io.writer`, `pipeline.io.writer.OPTIONS`, `pipeline.io.writer.seal`, "
    text += "`pipeline.io.writer.gone`, `pipeline.io.nothing.X`"
    assert missing_names(text, tmp_path) == ["pipeline.io.writer.gone", "pipeline.io.nothing.X"]


def _contract_settings() -> list[tuple[str, str]]:
    """(name, default) of each setting in the contract's settings table, in its order."""
    section = (REPO / "docs" / "contract.md").read_text().partition("\n## 3. Settings\n")[2]
    table = [line for line in section.split("\n## ")[0].splitlines() if line.startswith("| `")]
    rows = []
    for line in table:
        names, defaults = (cell.strip() for cell in line.strip("|").split("|")[:2])
        found = INLINE_CODE.findall(names)
        values = [d.strip().strip("`") for d in defaults.split(",")]
        rows += zip(found, values * len(found) if len(values) == 1 else values, strict=True)
    return rows


def test_the_contract_lists_every_setting_with_its_default() -> None:
    from pipeline.settings import setting_defaults, setting_fields

    def shown(value: object) -> str:
        return "null" if value is None else str(value).lower()

    defaults = setting_defaults()
    expected = [
        (name, shown(defaults[name]) if name in defaults else "required")
        for name, _, _ in setting_fields()
    ]
    assert _contract_settings() == expected
