"""The README's promises, checked: its commands run, its tables match the code and CI."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heterps_cli import errors
from heterps_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
runner = CliRunner()


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


def test_quick_start_output_is_what_the_command_prints():
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    shown = re.findall(r"```\n(ctr on paper.*?)```", quick, flags=re.S)[0]
    result = runner.invoke(
        app, ["plan", str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "88"}
    )
    assert result.exit_code == 0, result.output

    def normal(text: str) -> list[str]:  # the solve time is the machine's, not the tool's
        return [re.sub(r"solved in +[\d.]+ s", "solved in X s", line.rstrip()) for line in text.strip().splitlines()]

    assert normal(result.stdout) == normal(shown)


COMMANDS = [
    line for block in _code_blocks(README, "bash") for line in block.splitlines() if line.startswith("heterps ")
]


@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if " compare " in c else c for c in COMMANDS]
)
def test_readme_commands_run(command, tmp_path, monkeypatch):
    for folder in ("profiles", "clusters", "docs/plans"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output


def test_exit_code_table_matches_the_code():
    table = dict(re.findall(r"^\| (\d) \| (.+?) \|$", README, flags=re.M))
    assert {int(k) for k in table} == {
        0,
        errors.EXIT_CHECK_FAILED,
        errors.EXIT_BAD_INPUT,
        errors.EXIT_INFEASIBLE,
        errors.EXIT_INTERNAL,
        errors.EXIT_NOT_FOUND,
    }


def test_readme_error_examples_are_what_the_tool_prints(tmp_path, monkeypatch):
    profile = (
        (ROOT / "profiles/ctr.yaml").read_text().replace("    weight_size: 1024000000", "    weight_sise: 1024000000")
    )
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/mine.yaml").write_text(profile)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["validate", "profiles/mine.yaml"])
    shown = next(line for line in README.splitlines() if "weight_sise" in line)
    assert shown.rstrip("…").split(": ", 1)[1].strip() in result.stderr


def test_the_readme_layout_lists_every_module_and_only_those():
    layout = README.split("## Development", 1)[1].split("```")[1]
    listed, folder = set(), ""
    for indent, name in re.findall(r"^( {2,4})(\S+\.py|\S+/)", layout, flags=re.M):
        if len(indent) == 2:
            folder = name if name.endswith("/") else ""
        listed.add(name if len(indent) == 2 else folder + name)
    on_disk = {str(p.relative_to(ROOT / "heterps_cli")) for p in (ROOT / "heterps_cli").rglob("*.py")}
    on_disk = {p for p in on_disk if not p.endswith("__init__.py") or p == "__init__.py"} - {"__main__.py"}
    assert {n for n in listed if n.endswith(".py")} == on_disk


def test_the_use_from_python_example_runs_and_prints_the_plan(monkeypatch, capsys):
    section = README.split("## Use from Python", 1)[1].split("\n## ", 1)[0]
    (example,) = _code_blocks(section, "python")
    assert len(example.strip().splitlines()) <= 6
    monkeypatch.chdir(ROOT)
    exec(compile(example, "README.md", "exec"), {})
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
