"""Odd terminals, signals and names (docs/commands.md, "Output" and "What heterps refuses, and why"),
a test per class:

4. exit codes tell the truth (a closed pipe, any width or encoding, a long name, signals);
6. one name rule (NFC, nothing invisible, no outer spaces);
7. output for a person at any width, without a library's warnings or a bar in a log.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import unicodedata
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import HEAD, ROOT, heterps

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
PLAN = str(ROOT / "docs/plans/ctr.yaml")
PLACED = ROOT / "docs/plans/ctr-aws-p3.yaml"  # two nodes


# 4. Exit codes ---------------------------------------------------------------------------------------


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_a_reader_that_goes_away_does_not_change_the_exit_code(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_bytes((ROOT / "docs/plans/ctr.yaml").read_bytes())
    job = f"--profile {CTR} --cluster {PAPER}"
    for command, code in ((f"check {plan} {job}", 0), (f"check {plan} {job} --max-cost 0.1", 1), ("--help", 0)):
        shell = f"{' '.join(HEAD)} {command} | true; echo $? ${{PIPESTATUS[0]}}"
        done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["0", str(code)] and done.stderr == "", done


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("columns", ["0", "10"])
def test_any_width_prints_the_figures_and_the_errors(columns):
    done = heterps("plan", CTR, PAPER, "-s", "exact", env={"COLUMNS": columns})
    assert done.returncode == 0
    for figure in ("$0.80", "1,326,103", "34", "0.00305"):
        assert figure in done.stdout
    refused = heterps("validate", "no-such-file.yaml", env={"COLUMNS": columns})
    assert refused.returncode == 2 and "no-such-file.yaml: file not found" in refused.stderr


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_a_terminal_that_cannot_show_unicode_gets_escapes_not_an_internal_error(tmp_path):
    out = tmp_path / "plan.yaml"
    done = heterps("plan", CTR, PAPER, "-s", "exact", "--out", str(out), env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert "\\xb7" in done.stdout and yaml.safe_load(out.read_text())["feasible"] is True
    piped = heterps("plan", CTR, PAPER, "-s", "exact", "--out", "-", env={"PYTHONIOENCODING": "ascii"})
    assert piped.returncode == 0 and yaml.safe_load(piped.stdout)["cost_usd"] > 0


@pytest.mark.parametrize("name", ["a" * 300 + ".yaml", "d" * 300 + "/plan.yaml"])
def test_a_name_no_file_system_holds_is_bad_input(runner, tmp_path, name):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "greedy", "--out", str(tmp_path / name)])
    assert result.exit_code == 2 and "over 255 bytes" in result.stderr


@pytest.mark.parametrize("count", ["²", "٣", "3.0", "-1", "0", "1e3", "1_000", " 3"])
def test_a_count_is_ascii_digits_or_refused(runner, count):
    result = runner.invoke(app, ["cluster", f"p3.8xlarge={count}"])
    assert result.exit_code == 2 and "COUNT must be a whole number" in result.stderr


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_sigterm_while_the_users_factory_runs_is_143_not_the_users_fault(tmp_path):
    factory = tmp_path / "slow.py"
    factory.write_text(
        "import sys, time\n"
        "def make():\n"
        "    sys.stderr.write('factory started\\n'); sys.stderr.flush()\n"
        "    time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [*HEAD, "profile", f"{factory}:make", "--as", "cpu", "--batch-size", "2", "--out", str(tmp_path / "p.yaml")],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while "factory started" not in process.stderr.readline():
            assert time.monotonic() < deadline and process.poll() is None
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        said = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 143 and "sys.exit" not in said and not (tmp_path / "p.yaml").exists()


# 6. Names ------------------------------------------------------------------------------------------

INVISIBLE = ["\u200b", "\u2060", "\ufeff", "\u00ad", "\u061c", "\u3164", "\u00a0", "\u2028", "\ufe0f"]


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_a_name_that_reads_as_another_is_refused(runner, tmp_path, char):
    cluster = yaml.safe_load(Path(PAPER).read_text())
    cluster["resources"][f"cpu{char}"] = dict(cluster["resources"]["cpu"])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster, allow_unicode=True))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and f"U+{ord(char):04X}" in result.stderr
    assert char not in result.stderr  # shown as its escape, never as itself


@pytest.mark.parametrize("name", [" ", "   ", "\t", " cpu", "cpu "])
def test_a_blank_or_padded_name_is_refused(runner, tmp_path, name):
    cluster = yaml.safe_load(Path(PAPER).read_text())
    cluster["resources"][name] = dict(cluster["resources"]["cpu"])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster, allow_unicode=True))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and ("space" in result.stderr or "visible" in result.stderr), result.stderr


def test_the_same_name_in_two_unicode_forms_is_one_name(runner, tmp_path):
    nfc, nfd = "gpü", unicodedata.normalize("NFD", "gpü")
    assert nfc != nfd
    profile = Path(CTR).read_text().replace("v100:", f"{nfd}:")
    cluster = Path(PAPER).read_text().replace("v100:", f"{nfc}:")
    (tmp_path / "p.yaml").write_text(profile)
    (tmp_path / "c.yaml").write_text(cluster)
    result = runner.invoke(app, ["plan", str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml"), "-s", "exact"])
    assert result.exit_code == 0 and nfc in result.stdout, result.output
    both = (
        Path(PAPER)
        .read_text()
        .replace("  cpu:", f"  {nfc}: {{price: 1.0, limit: 1}}\n  {nfd}: {{price: 1.0, limit: 1}}\n  cpu:")
    )
    (tmp_path / "both.yaml").write_text(both)
    result = runner.invoke(app, ["validate", str(tmp_path / "both.yaml")])
    assert result.exit_code == 2 and "composed differently" in result.stderr


# 7. Output for a person ------------------------------------------------------------------------------


def test_a_narrow_terminal_never_cuts_a_figure(runner):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact"], env={"COLUMNS": "10"})
    table = result.stdout.split("───", 1)[1].split("◀ the bottleneck")[0]
    for line in table.strip("─ \n").splitlines():
        figures = line.split()[-4:]  # CT s, DT s, samples/s (◀)
        assert not any(f.endswith("…") for f in figures), line


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
def test_no_library_warning_and_no_progress_bar_reach_a_log(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    env = {"MPLCONFIGDIR": str(blocked), "FORCE_COLOR": "1"}
    done = heterps("compare", CTR, PAPER, "--schedulers", "greedy,exact", "--plot", str(tmp_path / "c.png"), env=env)
    assert done.returncode == 0, done.stderr
    assert "matplotlib" not in done.stderr.lower() and "mkdir" not in done.stderr
    assert "\x1b[?25l" not in done.stderr and "\r" not in done.stderr  # no bar drawn into the file


# -- escape sequences from input files -----------------------------------------------------------------


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    for folder in ("profiles", "clusters"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy(PLAN, tmp_path / "plan.yaml")
    return tmp_path / "profiles/ctr.yaml", tmp_path / "clusters/paper.yaml", tmp_path / "plan.yaml"


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("name: fc2", 'name: "A\\e[31mRED\\e]0;TITLE\\a"', "layers[4].name"),  # printed raw by plan
        ("model: ctr", 'model: "ctr\\u202e"', "model"),  # a bidirectional override reorders what is read
        ("type: fc", 'type: "fc\\x9b2J"', "layers[2].type"),  # C1 CSI
    ],
)
def test_control_characters_in_a_name_are_refused(runner, tmp_path, old, new, field):
    profile, cluster, _ = _files(tmp_path)
    profile.write_text(profile.read_text().replace(old, new, 1))
    result = runner.invoke(app, ["plan", str(profile), str(cluster), "-s", "greedy"])
    assert result.exit_code == 2, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output and "\x9b" not in result.output
    assert field in result.stderr and "control characters" in result.stderr and f"{profile}:" in result.stderr


def test_an_unknown_key_with_escapes_is_quoted_escaped(runner, tmp_path):
    profile, cluster, _ = _files(tmp_path)
    text = profile.read_text()
    profile.write_text(text.replace("batch_size:", '"\\e[2J\\e[Hcleared": 1\nbatch_size:', 1))
    result = runner.invoke(app, ["validate", str(profile)])
    assert result.exit_code == 2 and "\x1b" not in result.output
    assert "\\x1b[2J" in result.stderr and "unknown field" in result.stderr


def test_a_committed_plan_cannot_hide_its_own_failure(runner, tmp_path):
    profile, cluster, plan = _files(tmp_path)
    plan.write_text(plan.read_text().replace(" fc2,", ' "fc2\\e[1A\\e[2K\\e[8m",', 1))
    result = runner.invoke(app, ["check", str(plan), "--profile", str(profile), "--cluster", str(cluster)])
    assert result.exit_code == 2 and "\x1b" not in result.output and "control characters" in result.stderr


def test_markdown_reports_show_names_as_text(runner, tmp_path):
    profile, cluster, plan = _files(tmp_path)
    # A renamed layer makes check quote both names in its message; one opens an HTML comment.
    profile.write_text(profile.read_text().replace("name: fc2", "name: fc2<!--", 1))
    result = runner.invoke(
        app, ["check", str(plan), "--profile", str(profile), "--cluster", str(cluster), "--format", "markdown"]
    )
    assert result.exit_code == 1, result.output
    assert "<!--" not in result.stdout and "fc2&lt;!--" in result.stdout
    assert result.stdout.count("\n| ") >= 2  # the table's rows all there
