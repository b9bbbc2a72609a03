"""The README names only what exists: every repository path and module it mentions, and
every `docs/*.md` it links to."""

from __future__ import annotations

import re
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
    from pipeline.settings import Settings

    def shown(value: object) -> str:
        return "null" if value is None else str(value).lower()

    expected = [
        (name, "required" if field.is_required() else shown(field.default))
        for name, field in Settings.model_fields.items()
    ]
    assert _contract_settings() == expected
