"""Hostile and careless input, overflowing numbers, output files, interrupts, misleading errors (issue 12).

Every case runs the real CLI on real files. The rule they all check: bad input
ends with `file:line: field: message` lines and exit 2, never a traceback, and
no file is lost or damaged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from heterps_cli.cli.app import app
from heterps_cli.figures import count, duration, usd

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = Path(__file__).parent / "data" / "hostile"
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
runner = CliRunner()


def _no_traceback(result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def _bad(args: list[str], *expected: str, code: int = 2) -> str:
    result = runner.invoke(app, args)
    _no_traceback(result)
    assert result.exit_code == code, result.output
    for text in expected:
        assert text in result.stderr, result.stderr
    return result.stderr


# -- hostile YAML -----------------------------------------------------------------------

HOSTILE_CASES = {
    "binary.yaml": "binary.yaml:3: control character U+0000 at column 1",
    "recursive_alias.yaml": "recursive_alias.yaml:3: layers[0]: recursive alias",
    "deep_nesting.yaml": "deep_nesting.yaml:3: refused: nesting too deep",
    "billion_laughs.yaml": "aliases expand to more than 100,000 nodes",
    "python_object.yaml": "python_object.yaml:1: not valid YAML: could not determine a constructor for the tag",
    "non_utf8.yaml": "non_utf8.yaml:1: not UTF-8 text: byte 0xe9 at offset 10",
    "tabs.yaml": "(indent with spaces: YAML does not allow tabs there)",
}


@pytest.mark.parametrize("name", HOSTILE_CASES)
def test_hostile_yaml_is_refused_with_its_position(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a python/object tag that ran would leave a file here
    path = str(HOSTILE / name)
    for args in (["validate", path], ["plan", path, PAPER, "-s", "exact"], ["validate", CTR, path]):
        _bad(args, HOSTILE_CASES[name])
    assert not list(tmp_path.iterdir()), "nothing was executed"


@pytest.mark.parametrize("name", HOSTILE_CASES)
def test_the_pure_python_loader_refuses_them_too(name, monkeypatch):
    from heterps_cli import yamlio

    monkeypatch.setattr(yamlio, "_LOADERS", [yamlio._Loader])  # as on a machine without libyaml
    _bad(["validate", str(HOSTILE / name)], HOSTILE_CASES[name].split(": ", 1)[-1][:40])


def test_a_file_over_64_mib_is_refused_before_parsing(tmp_path):
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: costs no disk and no time to make
    _bad(["validate", str(huge)], "huge.yaml: file is over 64 MiB")


def test_yaml_1_2_numbers_never_read_as_other_numbers(tmp_path):
    text = Path(CTR).read_text().replace("batch_size: 4096", "batch_size: 0100", 1)
    (tmp_path / "p.yaml").write_text(text)
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0 and "batch size 100" in result.stdout, result.output  # YAML 1.1 read 64
    (tmp_path / "p.yaml").write_text(text.replace("batch_size: 0100", "batch_size: 1:04", 1))
    _bad(["validate", str(tmp_path / "p.yaml")], "batch_size: must be a whole number (got str '1:04')")
    (tmp_path / "p.yaml").write_text(text.replace("model: ctr", "model: yes", 1))
    result = runner.invoke(app, ["validate", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0 and "model yes" in result.stdout, result.output  # a string, not True


# -- numbers that overflow --------------------------------------------------------------


def test_a_job_whose_cost_overflows_is_bad_input_naming_the_settings():
    _bad(
        ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e308", "--scheduler", "exact"],
        "samples x epochs: ",
        "would overflow",
    )
    _bad(
        ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e308", "--scheduler", "exact", "--json"],
        "would overflow",
    )


def test_a_job_size_in_the_profile_that_overflows_names_the_profile_line(tmp_path):
    text = Path(CTR).read_text()
    samples_line = next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith("samples:"))
    (tmp_path / "p.yaml").write_text(
        re.sub(r"samples: \S+", "samples: 1.7e308", text, count=1).replace("epochs: 1", "epochs: 10", 1)
    )
    _bad(["plan", str(tmp_path / "p.yaml"), PAPER, "-s", "exact"], f"p.yaml:{samples_line}: job.samples x ")


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--min-throughput", "inf"),
        ("--max-cost", "inf"),
        ("--samples", "nan"),
        ("--epochs", "inf"),
        ("--samples", "-1"),
        ("--seed", "-1"),
        ("--seed", str(2**64)),
    ],
)
def test_non_finite_options_are_refused(flag, value):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", flag, value])
    assert result.exit_code == 2 and flag in result.output, result.output
    _no_traceback(result)


def test_huge_but_finite_figures_print_short_and_json_stays_json():
    result = runner.invoke(
        app, ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e280", "-s", "exact"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"cost +\$\d\.\d+e\+\d+", result.stdout) and "years" in result.stdout, result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) < 200
    result = runner.invoke(app, ["plan", CTR, PAPER, "--samples", "1e10", "--epochs", "1e280", "-s", "exact", "--json"])

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    plan = json.loads(result.stdout, parse_constant=refuse)
    assert plan["cost_usd"] > 1e280


def test_small_costs_keep_significant_digits():
    assert usd(0.0031) == "$0.0031" and usd(0.8) == "$0.80" and usd(1234.5) == "$1,234.50"
    assert usd(8.02e-7) == "$8.02e-07" and usd(0) == "$0.00" and usd(3.3e20) == "$3.3e+20"
    assert count(1326102.8) == "1,326,103" and count(2e20) == "2e+20"
    assert (
        duration(28) == "28.0 s"
        and duration(4710.1) == "79 min"
        and duration(9000) == "2 h 30 min"
        and "years" in duration(1e300)
    )
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", "--samples", "35000000"])
    assert result.exit_code == 0, result.output
    cost = re.search(r"^cost +(\S+)", result.stdout, flags=re.M).group(1)
    assert cost.startswith("$0.0") and cost != "$0.00" and len(cost.rstrip("0")) >= 5, cost


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("limit", 10**400, "resources.cpu.limit: must be <= 1,000,000,000"),
        ("limit", 9 * 10**18, "resources.cpu.limit: must be <= 1,000,000,000"),
        ("price", 1e400, "resources.cpu.price: must be a finite number"),
    ],
)
def test_numbers_past_what_the_model_can_use_are_refused(tmp_path, field, value, message):
    cluster = yaml.safe_load(Path(PAPER).read_text())
    cluster["resources"]["cpu"][field] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster).replace("inf", "1e400"))
    _bad(["plan", CTR, str(tmp_path / "c.yaml"), "-s", "greedy"], message)


# -- output files -----------------------------------------------------------------------


def _plan_to(out: str, *extra: str):
    return runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", "--out", out, *extra])


def test_out_follows_a_symlink_and_replaces_its_target(tmp_path):
    (tmp_path / "target.yaml").write_text("old\n")
    (tmp_path / "link.yaml").symlink_to("target.yaml")
    assert _plan_to(str(tmp_path / "link.yaml")).exit_code == 0
    assert (tmp_path / "link.yaml").is_symlink()
    assert yaml.safe_load((tmp_path / "target.yaml").read_text())["scheduler"] == "exact"


def test_out_refuses_a_fifo_and_a_directory_and_still_shows_the_plan(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = _plan_to(str(fifo))
    assert result.exit_code == 2 and "exists and is a FIFO" in result.stderr, result.output
    assert "throughput" in result.stdout, "the finished run's plan is shown all the same"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    result = _plan_to(str(tmp_path / "newdir") + "/")
    assert result.exit_code == 2 and "names a directory" in result.stderr
    assert not (tmp_path / "newdir").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"], "no temporary file left"


def test_out_dash_is_standard_output():
    result = _plan_to("-")
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["scheduler"] == "exact"


def test_new_files_get_0644_less_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o027)
    try:
        assert _plan_to(str(tmp_path / "new.yaml")).exit_code == 0
        assert stat.S_IMODE(os.stat(tmp_path / "new.yaml").st_mode) == 0o640
        (tmp_path / "mine.yaml").write_text("old\n")
        os.chmod(tmp_path / "mine.yaml", 0o600)
        assert _plan_to(str(tmp_path / "mine.yaml")).exit_code == 0
        assert stat.S_IMODE(os.stat(tmp_path / "mine.yaml").st_mode) == 0o600
    finally:
        os.umask(old)


def _run_and_signal(args: list[str], sig: int, after: float, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python -m heterps_cli ARGS`` and send ``sig`` after ``after`` seconds; the process always ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "heterps_cli", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(after)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.parametrize("sig,code,message", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_run_leaves_the_existing_out_file_untouched(tmp_path, sig, code, message):
    existing = tmp_path / "plan.yaml"
    existing.write_text("the committed plan\n")
    # random search with a budget it cannot finish in time: the signal lands mid-search
    done = _run_and_signal(
        [
            "plan",
            str(ROOT / "profiles/vgg16.yaml"),
            str(ROOT / "clusters/three-type.yaml"),
            "-s",
            "random",
            "--evaluations",
            "100000000",
            "--out",
            "plan.yaml",
        ],
        sig,
        1.5,
        tmp_path,
    )
    assert done.returncode == code, (done.returncode, done.stderr)
    assert existing.read_text() == "the committed plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"], "no temporary file left"
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines() == [message], done.stderr


def test_ctrl_c_while_loading_is_one_line_and_exit_130(tmp_path):
    done = _run_and_signal(["plan", CTR, PAPER, "-s", "rl"], signal.SIGINT, 0.3, tmp_path)  # mid-import
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ctrl_c_in_rl_training_prints_and_writes_the_best_plan_then_exits_130(tmp_path, interrupt_evaluations):
    interrupt_evaluations(4)  # the pool, then a few training batches
    result = runner.invoke(app, ["plan", CTR, PAPER, "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 130, result.output
    assert "training interrupted (Ctrl-C)" in result.stdout and "cost" in result.stdout
    assert "interrupted: the plan above is the best found before Ctrl-C" in result.stderr
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["feasible"] is True


def test_ctrl_c_in_compare_marks_the_row_and_exits_130_at_the_end(interrupt_evaluations):
    interrupt_evaluations(4)
    result = runner.invoke(app, ["compare", CTR, PAPER, "--schedulers", "rl,greedy,exact"])
    assert result.exit_code == 130, result.output
    assert re.search(r"^ ?rl\* +yes", result.stdout, flags=re.M), result.stdout
    assert "* interrupted (Ctrl-C)" in result.stdout and re.search(r"^ ?exact +yes", result.stdout, flags=re.M)
    assert "Ctrl-C cut rl short" in result.stderr


# -- errors that mislead ----------------------------------------------------------------


def test_did_you_mean_suggests_only_a_different_valid_key(tmp_path):
    (tmp_path / "c.yaml").write_text("name: mine\nresources:\n  cpu: {price: 0.04, limit: 8}\n")
    stderr = _bad(
        ["validate", CTR, str(tmp_path / "c.yaml")], "c.yaml:1: name: unknown field 'name'; did you mean 'cluster'?"
    )
    assert "did you mean 'name'" not in stderr and "required field is missing" not in stderr
    (tmp_path / "c.yaml").write_text("cluster: c\nresources:\n  cpu: {price: 0.04, limit: 8, layers: 3}\n")
    stderr = _bad(["validate", CTR, str(tmp_path / "c.yaml")], "resources.cpu.layers: unknown field 'layers'")
    assert "did you mean 'layers'" not in stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["check", CTR, "--profile", CTR, "--cluster", PAPER], "this is a model profile, not a plan"),
        (
            ["check", str(ROOT / "docs/plans/ctr.yaml"), "--profile", PAPER, "--cluster", PAPER],
            "this is a cluster, not a model profile",
        ),
        (
            ["validate", CTR, CTR],
            f"ctr.yaml:{Path(CTR).read_text().splitlines().index('layers:') + 1}: "
            "this is a model profile, not a cluster",
        ),
        (["plan", str(ROOT / "docs/plans/ctr.yaml"), PAPER], "this is a plan, not a model profile"),
        (["diff", CTR, str(ROOT / "docs/plans/ctr.yaml")], "this is a model profile, not a plan"),
    ],
)
def test_a_file_of_the_wrong_kind_is_named_as_such(args, message):
    _bad(args, message)


def _broken_profile(tmp_path, n_bad: int) -> str:
    data = yaml.safe_load(Path(CTR).read_text())
    for i in range(n_bad):
        layer = data["layers"][i % len(data["layers"])]
        layer["times"]["cpu"]["oct"] = -1 - i // len(data["layers"])
        if i >= len(data["layers"]):
            layer[f"typo{i}"] = 1
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return str(tmp_path / "p.yaml")


def test_every_problem_in_both_files_is_shown_at_once(tmp_path):
    profile = _broken_profile(tmp_path, 3)
    (tmp_path / "c.yaml").write_text("cluster: c\nresources:\n  cpu: {price: -1, limit: 8}\n")
    for command in (["validate", profile, str(tmp_path / "c.yaml")], ["plan", profile, str(tmp_path / "c.yaml")]):
        lines = _bad(command).strip().splitlines()
        assert len(lines) == 4, lines
        assert all(re.match(r"error: \S+\.yaml:\d+: \S+: ", line) for line in lines), lines
        assert sum("times.cpu.oct: must be > 0" in line for line in lines) == 3
        assert "c.yaml:3: resources.cpu.price: must be >= 0" in lines[-1]


def test_at_most_twenty_problems_and_a_count_of_the_rest(tmp_path):
    lines = _bad(["validate", _broken_profile(tmp_path, 25)]).strip().splitlines()
    assert len(lines) == 21 and lines[-1] == "error: … and 5 more problems", lines


def test_validate_says_what_plan_will_need_when_the_profile_has_no_job(tmp_path):
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
    _bad(
        ["profile", f"{factory}:make", "--as", "cpu", "--batch-size", "8", "--out", str(tmp_path / "o.yaml")],
        f"{factory}:11: the model's forward pass failed: RuntimeError",
    )


# -- plans that do not compare ----------------------------------------------------------


def test_diff_of_plans_for_different_jobs_warns_and_still_exits_0(tmp_path):
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


def test_names_with_markup_print_as_themselves(tmp_path):
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


def test_help_shows_no_bool_placeholder_for_flags():
    for args in (["--help"], ["plan", "--help"], ["compare", "--help"]):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        flags = [line for line in result.stdout.splitlines() if re.search(r"--(json|version)\b", line)]
        assert flags and not any("<bool>" in line for line in flags), flags


def test_plan_summary_shows_the_units_and_singular_counts():
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact"], env={"COLUMNS": "200"})
    assert "cpu 35 of 480 CPU cores, v100 1 of 32" in result.stdout, result.stdout
    result = runner.invoke(app, ["validate", CTR, str(ROOT / "clusters/paper.yaml")], env={"COLUMNS": "200"})
    assert "cluster paper, 2 resource types" in result.stdout


def test_compare_fits_80_columns():
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


def test_an_internal_error_is_one_line_and_exit_4_with_the_traceback_on_request(monkeypatch):
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


def test_a_40_kb_name_is_refused_not_rendered(tmp_path):
    text = Path(CTR).read_text().replace("name: fc1", "name: " + "x" * 40_000, 1)
    (tmp_path / "p.yaml").write_text(text)
    stderr = _bad(
        ["plan", str(tmp_path / "p.yaml"), PAPER, "-s", "exact"], "name: must be at most 256 characters (got 40,000)"
    )
    assert len(stderr) < 400  # the value is cut short in the message too
