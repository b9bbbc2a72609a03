"""The core knows no Dagster: the CLI and every core module import without it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from pipeline.sample_data import write_sample_data
from tests.support.samples import sample, write_step

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pipeline"
# Everything that imports Dagster lives here; the rest of `pipeline` is the core.
ORCHESTRATION = ("definitions.py", "assets", "orchestration")
# The one module that imports Ray: the tasks of a step on a cluster, beside the readers,
# loaded by `step/ray_route.py` only when a cluster is named.
RAY_TASKS = Path("step", "ray_ranks.py")


def core_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ORCHESTRATION or relative == RAY_TASKS:
            continue
        parts = ("pipeline", *relative.with_suffix("").parts)
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_the_core_is_every_module_outside_the_orchestration_layer() -> None:
    modules = core_modules()
    assert "pipeline.cli" in modules
    assert "pipeline.step.stages" in modules
    assert not any("orchestration" in name or "assets" in name for name in modules)


def test_threads_start_in_one_core_module() -> None:
    """The build reads top to bottom: work on other threads starts only in the speed
    module (the CLI's head start, the read's and the writer's pools), each behind a switch."""
    starting = re.compile(r"\b(threading|ThreadPoolExecutor|ProcessPoolExecutor|_thread)\b")

    def source(name: str) -> str:
        path = REPO / name.replace(".", "/")
        return (
            path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        ).read_text()

    found = sorted(name for name in core_modules() if starting.search(source(name)))
    assert found == ["pipeline.speed"]


def test_cli_and_core_import_without_dagster_or_ray() -> None:
    """Ray comes only with a cluster named (`step/ray_route.py`)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "top = {m.split('.')[0] for m in sys.modules}\n"
        "print(json.dumps(sorted(m for m in top if m.startswith('dagster') or m == 'ray')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
    ray_importers = [
        path.relative_to(PACKAGE)
        for path in sorted(PACKAGE.rglob("*.py"))
        if re.search(r"^\s*(import ray|from ray\b)", path.read_text(), re.MULTILINE)
    ]
    assert ray_importers == [RAY_TASKS]


def test_the_orchestration_layer_is_what_imports_dagster() -> None:
    """No core module names Dagster at all, so no arrow runs back up."""
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in ORCHESTRATION
        and ("import dagster" in path.read_text() or "from dagster" in path.read_text())
    ]
    assert offenders == []


BUILD_AND_LIST_MODULES = """
import sys
from pathlib import Path
from pipeline.io.discovery import find_sources
from pipeline.io.load import group_steps
from pipeline.settings import Settings
from pipeline.step.build import build_step
from pipeline.errors import StepError

((step, sources),) = group_steps(find_sources([sys.argv[1]])).items()
try:
    build_step(step, sources, Settings(global_batch_size=4), Path(sys.argv[2]))
except StepError as error:
    print(error.violations[0].rule)
print(sorted(name for name in ("pandera", "pandas", "pyarrow", "pydantic") if name in sys.modules))
"""


def _build_in_a_fresh_interpreter(inputs: Path, out: Path) -> str:
    command = [sys.executable, "-c", BUILD_AND_LIST_MODULES, str(inputs), str(out)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_a_valid_step_is_built_without_importing_pandera(tmp_path: Path) -> None:
    """Pandera (and pandas, which it imports) load only when a rule fails: a valid step is
    checked by one Polars query over the same rules. Nor does a build import pyarrow
    (Polars reads the rank files' footers), nor pydantic (the settings and the manifest it
    writes are dataclasses): each costs a fresh process a tenth of a second or more."""
    write_step(tmp_path / "in", [sample(i, reward=float(i % 2)) for i in range(8)])
    assert _build_in_a_fresh_interpreter(tmp_path / "in", tmp_path / "out") == "[]\n"

    write_step(tmp_path / "bad", [sample(i, reward=float(i % 2), leaf=-1) for i in range(8)])
    rule, loaded = _build_in_a_fresh_interpreter(tmp_path / "bad", tmp_path / "out").split("\n")[:2]
    assert rule == "leaf_greater_than_or_equal_to"
    assert {"pandas", "pandera"} <= set(json.loads(loaded.replace("'", '"')))


def _printed_lines(script: str) -> list[str]:
    """The lines a fresh interpreter prints running `script`."""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_a_build_without_the_rollout_side_schedule_never_loads_numpy(tmp_path: Path) -> None:
    """Strided ranks and reward normalization plan with Polars alone (0.1 cpu-s of numpy's
    import off every build); the rollout-side schedule (cp_size) loads numpy."""
    write_sample_data(tmp_path / "in")
    # every build draws its report (the project's own SVG, no figure library): no numpy
    script = (
        "import sys\n"
        "from pipeline.cli import main\n"
        f"args = ['build', {str(tmp_path / 'in')!r}, '--global-batch-size', '4',"
        " '--dp-size', '2']\n"
        f"print(main([*args, '--out', {str(tmp_path / 'plain')!r}]), 'numpy' in sys.modules)\n"
        f"print(main([*args, '--out', {str(tmp_path / 'scheduled')!r}, '--cp-size', '1',"
        " '--use-dynamic-batch-size', '--max-tokens-per-gpu', '100000']), 'numpy' in sys.modules)\n"
    )
    printed = [line for line in _printed_lines(script) if line.startswith("0 ")]
    assert printed == ["0 False", "0 True"]


def _printed_after(script: str, expression: str, env: dict[str, str]) -> str:
    """What a fresh interpreter prints for `expression` once `script` has run."""
    result = subprocess.run(
        [sys.executable, "-c", f"{script}\nimport os; print({expression})"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return result.stdout.strip()


def _allocator_conf(script: str, env: dict[str, str]) -> str:
    return _printed_after(script, "os.environ['_RJEM_MALLOC_CONF']", env)


def test_importing_the_package_changes_no_environment() -> None:
    """A trainer or notebook importing the package (and its layers) keeps its own
    environment: allocator and BLAS settings are the programs' business."""
    alone = "import os\nbefore = dict(os.environ)\nimport pipeline\n"
    assert _printed_lines(alone + "print(dict(os.environ) == before)")[-1] == "True"
    # The libraries set their own variables as they load (Polars its allocator's defaults):
    # loaded first, the package's layers add nothing to them.
    layers = (
        "import os, polars, numpy, dagster\n"
        "before = dict(os.environ)\n"
        "import pipeline.commands, pipeline.step.build, pipeline.step.stages\n"
        "import pipeline.orchestration.pipes_worker, pipeline.definitions\n"
        "print(dict(os.environ) == before)"
    )
    assert _printed_lines(layers)[-1] == "True"


def test_polars_allocator_takes_the_package_settings() -> None:
    """jemalloc itself, asked to print its options at exit, reports the package's: one
    arena for all threads and no separate arena for large allocations. A Polars that
    stopped reading `_RJEM_MALLOC_CONF` would fail here, not only in the benchmark."""
    import os

    from pipeline.speed import ALLOCATOR_ENV

    env = {k: v for k, v in os.environ.items() if k != ALLOCATOR_ENV}
    script = (
        "import os\n"
        "from pipeline.speed import tune_process\n"
        "tune_process()\n"
        "os.environ['_RJEM_MALLOC_CONF'] += ',stats_print:true,stats_print_opts:mdablxe'\n"
        "import polars as pl\n"
        "pl.Series(range(10)).sum()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, env=env
    )
    options = dict(
        line.strip().split(": ", 1)
        for line in result.stderr.splitlines()
        if line.strip().startswith("opt.") and ": " in line
    )
    assert options["opt.narenas"] == "1"
    assert options["opt.oversize_threshold"] == "0"
    assert options["opt.dirty_decay_ms"].startswith("2000")
    assert options["opt.muzzy_decay_ms"].startswith("0")


def _decay_for(folder: Path, env: dict[str, str]) -> str:
    """The allocator setting `rollout-shards build <folder>` runs with, as the program."""
    script = (
        "import os, sys\n"
        "exit = os._exit\n"
        "os._exit = lambda status: (print(os.environ.get('_RJEM_MALLOC_CONF')), exit(0))\n"
        "from pipeline.cli import main\n"
        f"sys.argv = ['rollout-shards', 'build', {str(folder)!r}, '--out', "
        f"{str(folder.parent / 'out')!r}]\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, env=env
    )
    return result.stdout.strip().splitlines()[-1]


def test_the_program_runs_with_the_package_allocator_settings(tmp_path: Path) -> None:
    """`rollout-shards build`, as the program, loads Polars with the package's allocator
    settings whatever its input; a user's own setting is left as it is."""
    import os

    from pipeline.speed import ALLOCATOR_CONF, ALLOCATOR_ENV

    env = {k: v for k, v in os.environ.items() if k != ALLOCATOR_ENV}
    polars_own = "dirty_decay_ms:500,muzzy_decay_ms:1000"
    folder = tmp_path / "in"
    folder.mkdir()
    with (folder / "step=1.parquet").open("wb") as handle:
        handle.truncate(1 << 30)  # sparse: a large input is treated like any other
    # Polars composed its own setting with ours: it read ours when it loaded.
    assert _decay_for(folder, env) == f"{polars_own},{ALLOCATOR_CONF}"
    user = {**env, ALLOCATOR_ENV: "dirty_decay_ms:100"}
    assert _decay_for(folder, user) == f"{polars_own},dirty_decay_ms:100"


def _threads_after(script: str, env: dict[str, str]) -> int:
    return int(_printed_after(script, "len(os.listdir('/proc/self/task'))", env))


def test_the_programs_load_polars_only_after_their_process_settings() -> None:
    """The CLI and the Pipes worker set the allocator in `main`: importing them loads no
    Polars or numpy, whose settings are read once, when they load."""
    script = (
        "import sys, pipeline.cli, pipeline.orchestration.pipes_worker\n"
        "print(sorted(m for m in ('polars', 'numpy') if m in sys.modules))"
    )
    assert _printed_lines(script)[-1] == "[]"


def test_the_process_settings_keep_openblas_to_one_thread() -> None:
    """numpy's OpenBLAS starts a thread per core when it loads; after the programs' process
    settings it starts none (the package calls no BLAS routine), unless the user asked for
    threads or numpy was loaded first. Importing the package alone changes nothing."""
    import os

    from pipeline.speed import BLAS_THREADS_ENV

    env = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_ENV}
    tuned = "from pipeline.speed import tune_process; tune_process()"
    alone = _threads_after("import numpy", env)
    assert alone == os.cpu_count() > 1  # the main thread and one more per further core
    assert _threads_after("import pipeline, numpy", env) == alone
    assert _threads_after(f"{tuned}; import numpy", env) == 1
    assert _threads_after(f"import numpy; {tuned}", env) == alone
    assert _threads_after(f"{tuned}; import numpy", {**env, BLAS_THREADS_ENV: "2"}) == 2


def test_a_trainer_module_is_reached_only_through_the_registry() -> None:
    """`pipeline/trainers/<name>/profile.py` is imported by nothing outside
    `pipeline/trainers/` (nor by tests, bench or the loader): the profile comes from
    `trainers.profile(name)`."""
    trainer_module = re.compile(
        r"(from\s+pipeline\.trainers\.\w+(\.profile)?\s+import|import\s+pipeline\.trainers\.\w+(\.profile)?\b(?!\.)"
        r"|from\s+pipeline\.trainers\s+import\s+"
        r"(?!BatchPlan|Profile|NAMES|profile|settings_model|flag_readers)\w+)"
    )
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("pipeline", "tests", "bench", "loader")
        for path in sorted((REPO / folder).rglob("*.py"))
        if (REPO / "pipeline" / "trainers") not in path.parents
        and path != Path(__file__).resolve()
        and trainer_module.search(path.read_text())
    ]
    assert offenders == []


# The core, which names no trainer: a trainer is reached by the registry alone
# (`trainers.profile(name)`, `trainers.settings_model(name)`), keyed by the `trainer`
# setting. The dump formats of `io/` read a trainer's own files, and are not core.
CORE = ("step", "schemas", "transforms", "io", "settings.py", "settings_files.py")
CORE_FILES = ("setting_marks.py", "cli.py", "commands.py", "streams.py", "manifest.py")
# the trainers' dump formats (one module each) are read in io/formats, outside the core
DUMP_FORMATS = ("io", "formats")


def _names_a_trainer(source: str) -> list[str]:
    """Where `source` names a trainer: a trainer's name as a value (the text "verl"), or
    an import of a trainer's package or any module of it."""
    import ast

    from pipeline import trainers

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in trainers.NAMES:
            found.append(f"line {node.lineno}: {node.value!r}")
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for module in modules:
            parts = module.split(".")
            if (
                parts[:2] == ["pipeline", "trainers"]
                and len(parts) > 2
                and parts[2] in trainers.NAMES
            ):
                found.append(f"line {node.lineno}: imports {module}")
                break
    return found


def test_the_core_names_no_trainer() -> None:
    """A trainer's name or module in the core fails this test (a fourth trainer, or a
    trainer's next change, adds a package under pipeline/trainers/ and nothing here)."""
    files = [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if (relative := path.relative_to(PACKAGE)).parts[0] in (*CORE, *CORE_FILES)
        and relative.parts[:2] != DUMP_FORMATS
    ]
    assert len(files) > 40
    named = {
        str(path.relative_to(REPO)): found
        for path in files
        if (found := _names_a_trainer(path.read_text()))
    }
    assert named == {}


def test_the_trainer_check_finds_a_name_and_a_module() -> None:
    assert _names_a_trainer('trainer = "verl"\n') == ["line 1: 'verl'"]
    assert _names_a_trainer("if s.trainer == 'miles':\n    pass\n") == ["line 1: 'miles'"]
    assert _names_a_trainer("from pipeline.trainers.slime.schedule import x\n") == [
        "line 1: imports pipeline.trainers.slime.schedule"
    ]
    assert _names_a_trainer("from pipeline.trainers import miles\n") == [
        "line 1: imports pipeline.trainers.miles"
    ]
    allowed = "from pipeline import trainers\nx = trainers.profile(name)\ns = 'miles PR'\n"
    assert _names_a_trainer(allowed) == []


def test_no_module_is_over_450_lines() -> None:
    long = {
        str(path.relative_to(REPO)): length
        for folder in ("pipeline", "loader")
        for path in sorted((REPO / folder).rglob("*.py"))
        if (length := len(path.read_text().splitlines())) > 450
    }
    assert long == {}


# A figure of speed or size: `1.5x`, `3-4x`, `12%`, `0.08 s`, `40 ms`, `156 MiB`, `2 cpu-s`,
# or a word that says how fast. Comments and docstrings say why; figures live in bench/.
FIGURE = re.compile(
    r"(?<![\w.])(?!0x)\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?"
    r"(?:x\b|\s?%|\s?ms\b|\s?s\b|\s?(?:[KMG]iB|[KMG]B)\b|\s?cpu-s\b)"
    r"|\b(?:faster|slower|quicker|speed-?up)\b",
    re.IGNORECASE,
)


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    import ast
    import io
    import tokenize

    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno
                found += [(first + i, line) for i, line in enumerate(doc.splitlines())]
    return found


def test_comments_and_docstrings_hold_no_figures() -> None:
    files = [*sorted(PACKAGE.rglob("*.py")), *sorted((REPO / "loader").rglob("*.py"))]
    found = [
        f"{path.relative_to(REPO)}:{line}: {text.strip()}"
        for path in files
        if "__pycache__" not in path.parts
        for line, text in _comments_and_docstrings(path)
        if FIGURE.search(text)
    ]
    assert found == []


def test_the_figure_check_finds_figures() -> None:
    figures = ["3-4x the", "1.5x", "12%", "0.08 s for", "40 ms", "156 MiB", "2 cpu-s", "faster"]
    other = ["0x10", "up to 8 times", "step 3", "v2", "a 1024-row group", "sha256"]
    assert [bool(FIGURE.search(t)) for t in figures] == [True] * len(figures)
    assert [bool(FIGURE.search(t)) for t in other] == [False] * len(other)


def _imported(path: Path) -> set[str]:
    """Every module `path` imports, by its full name (relative imports left out)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_verl_is_imported_by_the_loaders_verl_module_alone() -> None:
    """verl is loaded by the loader's verl modules alone: the legacy DataProto one and the
    V1 (TensorDict, agent-loop output) one."""
    loader = REPO / "loader" / "rollout_shards_loader"
    files = sorted(PACKAGE.rglob("*.py")) + sorted(loader.rglob("*.py"))
    importers = [
        path.relative_to(REPO).as_posix()
        for path in files
        if any(name == "verl" or name.startswith("verl.") for name in _imported(path))
    ]
    assert importers == [
        "loader/rollout_shards_loader/verl.py",
        "loader/rollout_shards_loader/verl_v1.py",
    ]


def _test_module_imports(path: Path) -> list[str]:
    """The modules a test file imports whose own name is a test file's (`test_*`)."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name.rpartition(".")[2].startswith("test_")]


def test_no_test_imports_another_test_file(tmp_path: Path) -> None:
    """Shared test helpers live in tests/support/ (or a conftest fixture), never in a test
    file another one imports; the check itself finds such an import."""
    tests = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(tests)): _test_module_imports(p) for p in tests.rglob("*.py")}
    assert {path: names for path, names in found.items() if names} == {}
    sample = tmp_path / "test_sample.py"
    sample.write_text("from test_backfill import launch\nimport tests.core.test_report\n")
    assert _test_module_imports(sample) == ["test_backfill", "tests.core.test_report"]
