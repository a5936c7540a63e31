"""docs/ci.md: the heterps commands of its GitHub Actions and GitLab CI examples run and pass as written."""

from __future__ import annotations

import re
import shlex
import shutil

import pytest

from heterps_cli.cli.app import app
from tests.helpers import ROOT

DOC = (ROOT / "docs/ci.md").read_text()
COMMANDS = [
    line.strip().lstrip("- ").strip()
    for block in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)
    for line in block.splitlines()
    if line.strip().lstrip("- ").startswith("heterps ")
]


def test_both_workflows_are_checked():
    assert sum(c.startswith("heterps check") for c in COMMANDS) == 2
    assert sum(c.startswith("heterps diff") for c in COMMANDS) == 2


@pytest.mark.parametrize("command", COMMANDS)
def test_ci_doc_commands_pass(runner, command, tmp_path, monkeypatch):
    for folder in ("profiles", "clusters", "docs/plans"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy(ROOT / "docs/plans/ctr.yaml", tmp_path / "baseline-plan.yaml")  # what `git show` gives
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    words = shlex.split(re.split(r"\s(?:\||>>)\s", command)[0])  # the shell's pipes and redirections aside
    result = runner.invoke(app, words[1:])
    assert result.exit_code == 0, result.output
