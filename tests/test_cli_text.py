"""What the command line prints: names as themselves, help without placeholders, 80 columns, one-line
internal errors, and the hints it gives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from heterps_cli.cli.app import app
from tests.helpers import ROOT, refused

HOSTILE = Path(__file__).parent / "data" / "hostile"
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


def test_validate_says_what_plan_will_need_when_the_profile_has_no_job(runner, tmp_path):
    data = yaml.safe_load(Path(CTR).read_text())
    del data["job"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "will need --samples" in result.stdout, result.output


def test_a_failing_forward_pass_names_the_factory_file_and_line(tmp_path):
    factory = tmp_path / "net.py"
    factory.write_text(
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n"
        "        return self.fc(x) @ torch.zeros(3, 3)\n\n\ndef make(batch_size):\n"
        "    return Net(), torch.randn(batch_size, 4)\n"
    )
    refused(
        ["profile", f"{factory}:make", "--as", "cpu", "--batch-size", "8", "--out", str(tmp_path / "o.yaml")],
        f"{factory}:11: the model's forward pass failed: RuntimeError",
    )


# -- plans that do not compare ----------------------------------------------------------


def test_diff_of_plans_for_different_jobs_warns_and_still_exits_0(runner, tmp_path):
    old = str(ROOT / "docs/plans/ctr.yaml")
    data = yaml.safe_load(Path(old).read_text())
    data.update(model="vgg16", min_throughput=1.0)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = runner.invoke(app, ["diff", old, str(tmp_path / "other.yaml")])
    assert (
        result.exit_code == 0 and "warning: the plans are for different jobs (model 'ctr' vs 'vgg16'" in result.stderr
    )
    for fmt, text in (("markdown", "⚠️ **warning:** the plans are for different jobs"), ("json", '"warnings": [')):
        result = runner.invoke(app, ["diff", old, str(tmp_path / "other.yaml"), "--format", fmt])
        assert result.exit_code == 0 and text in result.stdout, result.output
    result = runner.invoke(
        app,
        [
            "check",
            old,
            "--profile",
            CTR,
            "--cluster",
            PAPER,
            "--baseline",
            str(tmp_path / "other.yaml"),
            "--format",
            "json",
        ],
    )
    baseline = next(f for f in json.loads(result.stdout)["findings"] if f["gate"] == "baseline")
    assert baseline["status"] == "warn" and "different jobs" in baseline["message"]


# -- user strings are data, not markup --------------------------------------------------


def test_names_with_markup_print_as_themselves(runner, tmp_path):
    text = (
        Path(CTR)
        .read_text()
        .replace("model: ctr", "model: '[/]'", 1)
        .replace("name: fc1", "name: '[link=x]fc1[/link]'", 1)
    )
    (tmp_path / "p.yaml").write_text(text)
    result = runner.invoke(app, ["plan", str(tmp_path / "p.yaml"), PAPER, "-s", "exact"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("[/] on paper") and "[link=x]fc1[/link]" in result.stdout


# -- small things -----------------------------------------------------------------------


def test_help_shows_no_bool_placeholder_for_flags(runner):
    for args in (["--help"], ["plan", "--help"], ["compare", "--help"]):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        flags = [line for line in result.stdout.splitlines() if re.search(r"--(json|version)\b", line)]
        assert flags and not any("<bool>" in line for line in flags), flags


def test_plan_summary_shows_the_units_and_singular_counts(runner):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact"], env={"COLUMNS": "200"})
    assert "cpu 35 of 480 CPU cores, v100 1 of 32" in result.stdout, result.stdout
    result = runner.invoke(app, ["validate", CTR, str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "200"})
    assert "cluster paper, 2 resource types" in result.stdout


def test_compare_fits_80_columns(runner):
    result = runner.invoke(
        app,
        [
            "compare",
            CTR,
            str(ROOT / "clusters/three-type.yaml"),
            "--schedulers",
            "greedy,random,exact",
            "--evaluations",
            "200",
        ],
        env={"COLUMNS": "80"},
    )
    assert result.exit_code == 0, result.output
    assert max(len(line.rstrip()) for line in result.stdout.splitlines()) <= 80, result.stdout
    rows = [line for line in result.stdout.splitlines() if line.split()[:1] in (["greedy"], ["random"], ["exact"])]
    assert len(rows) == 3, result.stdout  # one line per scheduler: nothing wrapped


def test_importing_the_cli_imports_neither_torch_nor_numpy():
    code = "import sys, heterps_cli.cli.app; print(sorted({'torch', 'numpy', 'matplotlib'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


# -- internal errors (issue 13) ---------------------------------------------------------


def test_an_internal_error_is_one_line_and_exit_4_with_the_traceback_on_request(runner, monkeypatch):
    from heterps_cli.schedulers import exact

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(exact, "solve", broken)
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact"])
    assert result.exit_code == 4 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("internal error: ZeroDivisionError: a bug (heterps 0.1.0;"), lines
    for extra, env in ((["--debug"], {}), ([], {"HETERPS_DEBUG": "1"})):
        result = runner.invoke(app, [*extra, "plan", CTR, PAPER, "-s", "exact"], env=env)
        assert isinstance(result.exception, ZeroDivisionError), result.output
