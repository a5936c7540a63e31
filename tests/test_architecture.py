"""The shape of the code: no import cycles, a thin command line over heterps_cli.api, a usable library,
and the sizes docs/development.md keeps."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "heterps_cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _import_time_imports(tree: ast.Module, this: str, is_package: bool) -> set[str]:
    """The heterps_cli modules a module imports when it is itself imported: its top-level statements,
    not function bodies (lazy imports, for start-up time) nor ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and not _is_type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative
                base = this.split(".") if is_package else this.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}  # `from pkg import submodule`
    return found


def _lazy_imports(tree: ast.Module, this: str, is_package: bool) -> set[str]:
    """The heterps_cli modules a module imports inside its functions (when they run), outside
    ``if TYPE_CHECKING:`` blocks."""
    hidden = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    body = ast.Module(
        body=[n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))], type_ignores=[]
    )
    found: set[str] = set()
    for function in body.body:
        wrapped = ast.Module(
            body=[n for n in ast.walk(function) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in hidden],
            type_ignores=[],
        )
        found |= _import_time_imports(wrapped, this, is_package)
    return found


def _graph(lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the heterps_cli modules it imports. At import time, importing a.b.c first runs a and
    a.b, so those count too. With ``lazy``, the imports inside functions count as well, and only the
    modules an import names: the design's dependencies (a package whose function imports one of its
    modules is not in a cycle with it because that module's own imports run the package first)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree, is_package = ast.parse(path.read_text()), path.name == "__init__.py"
        imported = _import_time_imports(tree, name, is_package)
        if lazy:
            graph[name] = {m for m in imported | _lazy_imports(tree, name, is_package) if m in files} - {name}
            continue
        edges = set()
        for module in imported:
            if module in files:
                edges.add(module)
                parts = module.split(".")
                edges |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in files}
        graph[name] = edges - {name}
    return graph


@pytest.mark.parametrize("lazy", [False, True], ids=["at import", "lazy imports included"])
def test_the_import_graph_has_no_cycle(lazy):
    graph = _graph(lazy)
    assert len(graph) > 30 and graph["heterps_cli.schedulers.exact.scheduler"]  # the graph was read
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_library_modules_do_not_import_the_command_line():
    graph = _graph()
    for name, edges in graph.items():
        if not name.startswith("heterps_cli.cli") and name != "heterps_cli.__main__":
            assert not {e for e in edges if e.startswith("heterps_cli.cli")}, name


COMMANDS = ("plan", "frontier", "compare", "profile_command", "merge_command", "check", "diff", "validate")
# What a command may use besides its one api call: rendering, output formats and option types.
RENDERING = {
    "heterps_cli.cli.render",
    "heterps_cli.cli.render_ci",
    "heterps_cli.cli.render_files",
    "heterps_cli.cli.render_measured",
    "heterps_cli.ci.report",
    "heterps_cli.yamlio",  # dump_yaml: the plan file's text
    "heterps_cli.plots",  # frontier_png, compare_png: the pictures
    "heterps_cli.frontier",  # thin, write_plans: which plans to show, and their files
    "heterps_cli.profiling.write",  # measured_text, estimated_text, cluster_snippet: the profile file's text
    "heterps_cli.profiling.measure",  # NOISY_CV: when the profile view flags a layer
    "heterps_cli.schedulers",  # SolveOptions: the budget flags
    "heterps_cli",  # api itself
}


def test_each_command_makes_one_library_call_and_renders():
    functions = {
        f.name: f
        for path in (PACKAGE / "cli").glob("*.py")
        for f in ast.parse(path.read_text()).body
        if isinstance(f, ast.FunctionDef)
    }
    for name in COMMANDS:
        body = functions[name]
        imported = {n.module for n in ast.walk(body) if isinstance(n, ast.ImportFrom)}
        assert imported <= RENDERING, (name, imported - RENDERING)
        calls = [
            n.func.attr
            for n in ast.walk(body)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "api"
        ]
        assert len(calls) == 1, (name, calls)


def test_the_library_is_usable_from_python_and_imports_lazily():
    code = (
        "import sys, heterps_cli\n"
        "assert not {'numpy', 'torch', 'pydantic'} & set(sys.modules), 'import heterps_cli must be instant'\n"
        "from heterps_cli import load_problem, solve, Plan, Problem, InputError, InfeasibleError, api\n"
        "problem = load_problem('profiles/ctr.yaml', 'clusters/paper.yaml')\n"
        "plan = solve('exact', problem)\n"
        "assert isinstance(problem, Problem) and isinstance(plan, Plan) and plan.optimal\n"
        "assert 'torch' not in sys.modules, 'exact needs no torch'\n"
        "try:\n"
        "    load_problem('profiles/ctr.yaml', 'profiles/ctr.yaml')\n"
        "except InputError as exc:\n"
        "    assert 'ctr.yaml' in str(exc)\n"
        "try:\n"
        "    solve('exact', load_problem('profiles/ctr.yaml', 'clusters/paper.yaml', min_throughput=1e12))\n"
        "except InfeasibleError as exc:\n"
        "    assert 'fastest possible plan' in str(exc)\n"
        "same = api.plan('profiles/ctr.yaml', 'clusters/paper.yaml', 'exact')\n"
        "assert same.stages == plan.stages and same.cost_usd == plan.cost_usd\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_build_problem_takes_plain_validated_models():
    from heterps_cli.formats import Cluster, Profile
    from heterps_cli.problem import build_problem
    from heterps_cli.yamlio import load_yaml

    root = PACKAGE.parent
    profile = Profile.model_validate(load_yaml(root / "profiles/ctr.yaml").data)
    cluster = Cluster.model_validate(load_yaml(root / "clusters/paper.yaml").data)
    problem = build_problem(profile, cluster, min_throughput=1.0)
    assert problem.n_layers == len(profile.layers) and problem.min_throughput == 1.0
    with pytest.raises(ValueError, match="objective"):
        build_problem(profile, cluster, objective="speed")


# docs/development.md: a library function at most 60 lines (or its docstring says why it is longer), a
# command at most 80, a class at most 150, a test file at most 450.
FUNCTION_LINES, COMMAND_LINES, CLASS_LINES, TEST_FILE_LINES = 60, 80, 150, 450


def _commands() -> set[tuple[str, str]]:
    """(module, function) of every command the CLI registers, in groups too."""
    from heterps_cli.cli.app import app

    found, apps = set(), [app]
    while apps:
        typer_app = apps.pop()
        found |= {(c.callback.__module__, c.callback.__name__) for c in typer_app.registered_commands if c.callback}
        apps += [group.typer_instance for group in typer_app.registered_groups if group.typer_instance]
    return found


def test_functions_and_classes_keep_their_sizes():
    commands, over = _commands(), []
    assert ("heterps_cli.cli.app", "plan") in commands and len(commands) >= 10
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            if isinstance(node, ast.ClassDef) and lines > CLASS_LINES:
                over.append(f"{module}.{node.name}: a class of {lines} lines")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                most = COMMAND_LINES if (module, node.name) in commands else FUNCTION_LINES
                said = f"over {FUNCTION_LINES} lines" in (ast.get_docstring(node) or "").lower()
                if lines > most and not (said and most == FUNCTION_LINES):
                    over.append(f"{module}.{node.name}: {lines} lines")
    assert not over, over


def test_test_files_keep_under_450_lines():
    tests = Path(__file__).resolve().parent
    over = [
        f"{p.relative_to(tests)}: {n}"
        for p in tests.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > TEST_FILE_LINES
    ]
    assert not over, over
