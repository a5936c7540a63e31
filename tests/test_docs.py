"""The README's and the docs site's promises, checked: their commands run, their tables match the code and CI."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest

from heterps_cli import errors
from heterps_cli.cli.app import app
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
DOCUMENTED = [  # the pages whose heterps commands run against the bundled files as written
    "model.md", "files.md", "commands.md", "frontier.md", "large-models.md", "api.md", "development.md",
    "schedulers/index.md", "schedulers/exact.md", "schedulers/rl.md", "schedulers/tapp.md",
    "guide/profiling.md", "guide/running.md", "guide/check.md", "guide/renting.md",
]  # fmt: skip


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line for line in _code_blocks(quick, "bash")[0].splitlines() if line.strip()]
    assert len(commands) == 2
    install, test = commands
    assert install.startswith("pip install torch==2.13.0 ") and "heterps plan profiles/" in install
    ci = (ROOT / ".ci/run").read_text()
    assert "set -euo pipefail" in ci and "torch==2.13.0" in ci
    assert ci.strip().splitlines()[-1] == test


def test_quick_start_output_is_what_the_command_prints(runner):
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    shown = re.findall(r"```\n(ctr on paper.*?)```", quick, flags=re.S)[0]
    result = runner.invoke(
        app, ["plan", str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "88"}
    )
    assert result.exit_code == 0, result.output

    def normal(text: str) -> list[str]:  # the solve time is the machine's, not the tool's
        return [re.sub(r"solved in +[\d.]+ s", "solved in X s", line.rstrip()) for line in text.strip().splitlines()]

    assert normal(result.stdout) == normal(shown)


JOURNEY = README.split("## Your own model, start to finish", 1)[1].split("\n## ", 1)[0]
COMMANDS = [
    line
    for text in [README.replace(JOURNEY, ""), *((DOCS / page).read_text() for page in DOCUMENTED)]
    for block in _code_blocks(text, "bash")
    for line in block.splitlines()
    if line.startswith("heterps ")
]
SLOW = (" compare ", "heterps profile ", "heterps run ", " --steps ")  # trainings and measurements: seconds each


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if any(s in c for s in SLOW) else c for c in COMMANDS]
)
def test_documented_commands_run(runner, command, tmp_path, monkeypatch):
    for folder in ("profiles", "clusters", "docs/plans"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # measures a model and trains it: about 15 s
def test_the_readme_journey_runs_in_order(runner, tmp_path, monkeypatch):
    (block,) = _code_blocks(JOURNEY, "bash")
    commands = [line for line in block.splitlines() if line.strip()]
    assert [c.split()[1] for c in commands] == ["profile", "profile", "profile", "plan", "check", "run"]
    shutil.copytree(ROOT / "clusters", tmp_path / "clusters")
    monkeypatch.chdir(tmp_path)
    for command in commands:
        result = runner.invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) < 250
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).exists(), link


def test_the_cli_reference_is_generated_from_the_commands_and_documents_every_option():
    from heterps_cli.cli.reference import reference, undocumented

    assert undocumented() == []
    assert (DOCS / "cli.md").read_text() == reference(), "run: python -m heterps_cli.cli.reference > docs/cli.md"


def test_every_page_the_code_cites_exists():
    code = [path.read_text() for path in (ROOT / "heterps_cli").rglob("*.py")]
    cited = {page for text in code for page in re.findall(r"docs/[\w/.-]+\.md", text)}
    assert cited and {c for c in cited if not (ROOT / c).exists()} == set()


def test_every_docs_page_is_in_the_site_navigation():
    import yaml

    def pages(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        items = nav.values() if isinstance(nav, dict) else nav
        return set().union(*(pages(item) for item in items))

    listed = pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert listed == {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}


def test_exit_code_table_matches_the_code():
    table = dict(re.findall(r"^\| (\d) \| (.+?) \|$", (DOCS / "commands.md").read_text(), flags=re.M))
    assert {int(k) for k in table} == {
        0,
        errors.EXIT_CHECK_FAILED,
        errors.EXIT_BAD_INPUT,
        errors.EXIT_INFEASIBLE,
        errors.EXIT_INTERNAL,
        errors.EXIT_NOT_FOUND,
        errors.EXIT_WORKER_LOST,
    }


def test_readme_error_examples_are_what_the_tool_prints(runner, tmp_path, monkeypatch):
    profile = (
        (ROOT / "profiles/ctr.yaml").read_text().replace("    weight_size: 1024000000", "    weight_sise: 1024000000")
    )
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/mine.yaml").write_text(profile)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate", "profiles/mine.yaml"])
    shown = next(line for line in (DOCS / "files.md").read_text().splitlines() if "weight_sise" in line)
    assert shown.rstrip("…").split(": ", 1)[1].strip() in result.stderr


def test_the_layout_lists_every_module_and_only_those():
    layout = (DOCS / "development.md").read_text().split("```")[1]
    listed, folders = set(), {}  # the folder named at each depth (two spaces a level)
    for indent, name in re.findall(r"^( {2,})(\S+\.py|\S+/)", layout, flags=re.M):
        depth = len(indent) // 2 - 1
        listed.add("".join(folders[d] for d in range(depth)) + name)
        if name.endswith("/"):
            folders[depth] = name
    on_disk = {str(p.relative_to(ROOT / "heterps_cli")) for p in (ROOT / "heterps_cli").rglob("*.py")}
    on_disk = {p for p in on_disk if not p.endswith("__init__.py") or p == "__init__.py"} - {"__main__.py"}
    assert {n for n in listed if n.endswith(".py")} == on_disk


def test_the_use_from_python_example_runs_and_prints_the_plan(monkeypatch, capsys):
    (example,) = _code_blocks((DOCS / "api.md").read_text(), "python")
    assert len(example.strip().splitlines()) <= 6
    monkeypatch.chdir(ROOT)
    exec(compile(example, "docs/api.md", "exec"), {})
    shown = capsys.readouterr().out
    assert shown.startswith("$0.80 ") and "('v100', 1)" in shown


def test_the_spec_page_is_the_contract_the_code_cites():
    spec = (ROOT / "docs/spec.md").read_text()
    table = {int(k) for k in re.findall(r"^\| (\d+) \| .+ \|$", spec, flags=re.M)}
    codes = {getattr(errors, name) for name in dir(errors) if name.startswith("EXIT_")}
    assert table == {0} | codes
    sections = set(re.findall(r"^## (\d+b?)\.", spec, flags=re.M))
    cited = set()
    for path in (ROOT / "heterps_cli").rglob("*.py"):
        text = path.read_text()
        assert "SPEC" not in text, f"{path} cites the founding SPEC.md: cite docs/spec.md"
        cited |= set(re.findall(r"spec(?:\.md)? sections? (\d+b?)", text))
    assert cited and cited <= sections, cited - sections


def test_the_readme_command_table_and_the_commands_page_name_every_command_and_plan_option():
    """Hand-written lists cannot drift either: the README's table names every command, and the
    commands page's paragraph on `heterps plan` names every one of its options."""
    from heterps_cli.cli.reference import commands

    table = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n\n", 2)[1]
    listed = {" ".join(re.findall(r"^\| `(heterps(?: [a-z]+)+)", row)[0].split()[:2]) for row in table.splitlines()[2:]}
    top = {" ".join(path.split()[:2]) for path, _ in commands()}
    assert top <= listed, f"the README's command table leaves out {sorted(top - listed)}"
    paragraph = (
        (DOCS / "commands.md").read_text().split("`heterps plan PROFILE CLUSTER` options:", 1)[1].split("\n\n")[0]
    )
    plan = dict(commands())["heterps plan"]
    options = {o for p in plan.params if p.param_type_name == "option" for o in p.opts if o.startswith("--")}
    missing = {o for o in options if f"`{o}" not in paragraph} - {"--help"}
    assert not missing, f"docs/commands.md's plan paragraph leaves out {sorted(missing)}"
