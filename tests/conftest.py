"""Fixtures the test files share: the CLI runner, the bundled files, Ctrl-C mid-search, a trained policy.

Plain builders of test data (random instances, brute-force optima) live in
tests/helpers.py and tests/oracle/: they are called inside hypothesis
strategies and loops, where a fixture cannot go.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import ROOT
from tests.helpers import runner as cli_runner
from tests.profile_models import FACTORY as PROFILE_MODELS

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
QUICK_TRAINING = ["--steps", "15", "--batch", "16"]


# pytest-xdist starts its workers with COLUMNS=80, and rich pins a console to the COLUMNS it sees when
# it is made (the CLI's, on import): without it, as in a plain run, each test's own width holds.
os.environ.pop("COLUMNS", None)


@pytest.fixture(scope="session")
def runner() -> CliRunner:
    return cli_runner


@pytest.fixture()
def factory(tmp_path) -> Path:
    """A user's file of the small models the profile tests measure (tests/profile_models.py)."""
    path = tmp_path / "models.py"
    path.write_text(PROFILE_MODELS)
    return path


@pytest.fixture()
def files(tmp_path, monkeypatch) -> Path:
    """A working directory holding copies of profiles/, clusters/ and the committed plans (plans/)."""
    for folder in ("profiles", "clusters"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copytree(ROOT / "docs/plans", tmp_path / "plans")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def interrupt_evaluations(monkeypatch) -> Callable[[int], None]:
    """``interrupt_evaluations(n)``: the n-th cost-model evaluation raises KeyboardInterrupt, as Ctrl-C would."""
    from heterps_cli.schedulers import scoring

    def arm(on_call: int) -> None:
        original, calls = scoring.Evaluator.__call__, {"n": 0}

        def interrupting(self, rows):
            calls["n"] += 1
            if calls["n"] == on_call:
                raise KeyboardInterrupt
            return original(self, rows)

        monkeypatch.setattr(scoring.Evaluator, "__call__", interrupting)

    return arm


@pytest.fixture(scope="session")
def ctr_policy(tmp_path_factory, runner) -> Path:
    """A policy trained on the bundled ctr model and paper cluster (quick budget), saved once per session."""
    from heterps_cli.cli.app import app

    policy = tmp_path_factory.mktemp("policy") / "ctr.pt"
    result = runner.invoke(app, ["plan", CTR, PAPER, "--policy-out", str(policy), *QUICK_TRAINING])
    assert result.exit_code == 0 and policy.exists(), result.output
    return policy
