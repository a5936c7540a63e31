"""What an attacker or a careless user can do with paths, edited plans, odd terminals and names
(docs/commands.md, "What heterps refuses and why"): a test per class of failure, not per example.

1. every byte that reaches a shell is quoted (launch scripts run as written, nothing injected);
2. every file is written by one writer (no symlink followed in a folder, all or nothing, no stale file);
3. check compares every field a plan records;
4. exit codes tell the truth (a closed pipe, any width or encoding, a long name, signals);
5. heterps never writes a file it would refuse;
6. one name rule (NFC, nothing invisible, no outer spaces);
7. output for a person at any width, without a library's warnings or a bar in a log;
8. the right reason and the right figure.
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
import unicodedata
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.plots import tick_labels
from tests.helpers import ROOT, runner

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
PLACED = ROOT / "docs/plans/ctr-aws-p3.yaml"  # two nodes
VGG = ROOT / "docs/plans/vgg16-aws.yaml"  # pipelined, on nodes, with memory, bandwidth, links and a what-if
VGG_JOB = [
    "--profile",
    str(ROOT / "profiles/vgg16-aws.yaml"),
    "--cluster",
    str(ROOT / "clusters/aws-catalogue.yaml"),
    "--samples",
    "1000000",
    "--global-batch",
    "1024",
    "--min-throughput",
    "15000",
]
HEAD = [sys.executable, "-m", "heterps_cli"]


def _heterps(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*HEAD, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120, **kw
    )


# 1. Shell ------------------------------------------------------------------------------------------


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(body)
    path.chmod(0o755)


@pytest.fixture
def fake_cluster(tmp_path) -> tuple[Path, dict]:
    """Stand-ins for torchrun, srun and scontrol that record what they were given, on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv.jsonl"
    _stub(
        bin_dir,
        "torchrun",
        f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n",
    )
    _stub(bin_dir, "srun", '#!/bin/sh\nshift\nSLURM_NODEID=0 exec "$@"\n')  # one task: node 0
    _stub(bin_dir, "scontrol", "#!/bin/sh\necho node-a\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-a"}
    return record, env


HOSTILE_PLAN_NAMES = ["p\ntouch INJECTED\n.yaml", "-x.yaml", "$(touch INJECTED).yaml", "`touch INJECTED`.yaml"]


@pytest.mark.parametrize("name", HOSTILE_PLAN_NAMES)
def test_launch_scripts_pass_every_word_as_written_and_run_nothing_else(tmp_path, fake_cluster, name):
    record, env = fake_cluster
    plan = tmp_path / name
    plan.write_bytes(PLACED.read_bytes())
    out = tmp_path / "launch"
    model = "$HOME;touch INJECTED"
    args = ["launch", str(plan), "-o", str(out), "--model", model, "--map", "v100=cuda"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    for script in sorted(out.glob("node-*.sh")):
        subprocess.run(["sh", str(script)], cwd=tmp_path, env={**env, "MASTER_ADDR": "10.1.2.3"}, check=True)
    sbatch = (out / "launch.sbatch").read_text()
    first_command = next(i for i, line in enumerate(sbatch.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(sbatch.splitlines()) if line.startswith("#SBATCH"))
    subprocess.run(["bash", str(out / "launch.sbatch")], cwd=tmp_path, env=env, check=True)
    assert not (tmp_path / "INJECTED").exists() and not (out / "INJECTED").exists()
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(runs) == 3  # two nodes, then Slurm's node 0
    for argv in runs:
        tail = argv[argv.index("heterps_cli") :]
        assert tail[:3] == ["heterps_cli", "run", str(plan)]  # absolute, and never an option
        assert tail[tail.index("--model") + 1] == model
        assert argv[argv.index("--master-addr") + 1] in ("10.1.2.3", "node-a")


# 2. Files ------------------------------------------------------------------------------------------


def test_a_planted_symlink_in_the_folder_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "launch"
    out.mkdir()
    (out / "node-0.sh").symlink_to(outside)
    (out / "plan-001.yaml").symlink_to(outside)
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), "--map", "v100=cuda"]).exit_code == 0
    assert runner.invoke(app, ["frontier", CTR, PAPER, "--out", str(out)]).exit_code == 0
    assert outside.read_text() == "keep me" and not os.access(outside, os.X_OK)
    for name in ("node-0.sh", "plan-001.yaml"):
        assert stat.S_ISREG(os.lstat(out / name).st_mode)


def test_a_rerun_leaves_only_its_own_files_and_the_users(tmp_path):
    out = tmp_path / "launch"
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), "--map", "v100=cuda"]).exit_code == 0
    (out / "notes.txt").write_text("mine")
    one_node = ROOT / "docs/plans/ctr.yaml"
    assert runner.invoke(app, ["launch", str(one_node), "-o", str(out), "--map", "v100=cuda"]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["launch.sbatch", "node-0.sh", "notes.txt"]


@pytest.mark.parametrize("command", ["launch", "frontier"])
def test_a_set_of_files_is_written_whole_or_not_at_all(tmp_path, monkeypatch, command):
    from heterps_cli import outfiles

    out = tmp_path / "out"
    args = (
        ["launch", str(PLACED), "-o", str(out), "--map", "v100=cuda"]
        if command == "launch"
        else ["frontier", CTR, PAPER, "--out", str(out)]
    )
    assert runner.invoke(app, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    rename = outfiles.os.rename

    def fails_late(*a, **kw):
        calls["n"] += 1
        if calls["n"] == len(before) + 1:  # after every old file was moved aside and one new one placed
            raise OSError(5, "Input/output error")
        return rename(*a, **kw)

    monkeypatch.setattr(outfiles.os, "rename", fails_late)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "the folder is as it was" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.undo()
    blocker = out / ("node-1.sh" if command == "launch" else "plan-002.yaml")
    blocker.unlink()
    blocker.mkdir()  # a directory where a file must go: refused before anything is written
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "is a directory" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == {
        k: v for k, v in before.items() if k != blocker.name
    }


# 3. check compares every recorded field ----------------------------------------------------------

HOW_FOUND = {"scheduler", "seed", "evaluations", "solve_s", "notes", "optimal", "gap"}


def _leaves(data, path=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _leaves(value, (*path, i))
    else:
        yield path, data


def _edited(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 1.0
    if value is None:
        return 1.0
    return f"{value}x"


def _set(data, path, value):
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _check_after(tmp_path, edit) -> tuple[int, str]:
    plan = yaml.safe_load(VGG.read_text())
    edit(plan)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False, allow_unicode=True))
    result = runner.invoke(app, ["check", str(path), *VGG_JOB])
    return result.exit_code, " ".join(result.output.split())


def test_the_subject_plan_passes_as_written(tmp_path):
    code, shown = _check_after(tmp_path, lambda plan: None)
    assert code == 0, shown


EDITS = {
    "micro_batches": lambda p: p.update(micro_batches=p["micro_batches"] * 2, global_batch=p["global_batch"] * 2),
    "memory_gb of a type": lambda p: p["memory_gb"].update(l4=48.0),
    "bandwidth_gbps of a type": lambda p: p["bandwidth_gbps"].update(l4=1.0),
    "limits": lambda p: p["limits"].update(l4=17),
    "memory_reserved_gb added": lambda p: p.update(memory_reserved_gb={"l4": 1.0}),
    "memory_gb of a type added": lambda p: p["memory_gb"].update(tpu=8.0),
    "a stage's in_flight": lambda p: p["stages"][0].update(in_flight=2),
    "idle_units": lambda p: p.update(idle_units={**p["idle_units"], "cpu": 1}),
    "link_gbps": lambda p: p.update(link_gbps={"l4": 1.0}),
}


@pytest.mark.parametrize("edit", EDITS)
def test_check_fails_a_plan_whose_recorded_cluster_or_job_was_edited(tmp_path, edit):
    code, shown = _check_after(tmp_path, EDITS[edit])
    assert code in (1, 2) and ("stale" in shown or "error" in shown), shown


def test_a_gap_beside_optimal_is_refused(tmp_path):
    code, shown = _check_after(tmp_path, lambda p: p.update(gap=0.5, optimal=True))
    assert code == 2 and "gap: a gap says exact stopped before proving the plan optimal" in shown


@pytest.mark.slow
def test_every_recorded_field_edited_fails_check_but_how_it_was_found(tmp_path):
    plan = yaml.safe_load(VGG.read_text())
    for path, value in _leaves(plan):
        if path[0] in ("explanation", "what_if") and len(path) > 2:
            continue  # text and what-ifs: compared whole, so one edit of each is enough
        if value is None and path[0] in HOW_FOUND:
            continue  # not given: nothing to edit
        code, shown = _check_after(tmp_path, lambda p, path=path, value=value: _set(p, path, _edited(value)))
        if path[0] in HOW_FOUND:
            assert code == 0, (path, shown)
        else:
            assert code in (1, 2), (path, shown)


# 4. Exit codes ---------------------------------------------------------------------------------------


def test_a_reader_that_goes_away_does_not_change_the_exit_code(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_bytes((ROOT / "docs/plans/ctr.yaml").read_bytes())
    job = f"--profile {CTR} --cluster {PAPER}"
    for command, code in ((f"check {plan} {job}", 0), (f"check {plan} {job} --max-cost 0.1", 1), ("--help", 0)):
        shell = f"{' '.join(HEAD)} {command} | true; echo $? ${{PIPESTATUS[0]}}"
        done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["0", str(code)] and done.stderr == "", done


@pytest.mark.parametrize("columns", ["0", "10"])
def test_any_width_prints_the_figures_and_the_errors(columns):
    done = _heterps("plan", CTR, PAPER, "-s", "exact", env={"COLUMNS": columns})
    assert done.returncode == 0
    for figure in ("$0.80", "1,326,103", "34", "0.00304"):
        assert figure in done.stdout
    refused = _heterps("validate", "no-such-file.yaml", env={"COLUMNS": columns})
    assert refused.returncode == 2 and "no-such-file.yaml: file not found" in refused.stderr


def test_a_terminal_that_cannot_show_unicode_gets_escapes_not_an_internal_error(tmp_path):
    out = tmp_path / "plan.yaml"
    done = _heterps("plan", CTR, PAPER, "-s", "exact", "--out", str(out), env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert "\\xb7" in done.stdout and yaml.safe_load(out.read_text())["feasible"] is True
    piped = _heterps("plan", CTR, PAPER, "-s", "exact", "--out", "-", env={"PYTHONIOENCODING": "ascii"})
    assert piped.returncode == 0 and yaml.safe_load(piped.stdout)["cost_usd"] > 0


@pytest.mark.parametrize("name", ["a" * 300 + ".yaml", "d" * 300 + "/plan.yaml"])
def test_a_name_no_file_system_holds_is_bad_input(runner, tmp_path, name):
    result = runner.invoke(app, ["plan", CTR, PAPER, "-s", "greedy", "--out", str(tmp_path / name)])
    assert result.exit_code == 2 and "over 255 bytes" in result.stderr


@pytest.mark.parametrize("count", ["²", "٣", "3.0", "-1", "0", "1e3", "1_000", " 3"])
def test_a_count_is_ascii_digits_or_refused(runner, count):
    result = runner.invoke(app, ["cluster", f"p3.8xlarge={count}"])
    assert result.exit_code == 2 and "COUNT must be a whole number" in result.stderr


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


# 5. heterps writes only what it reads ------------------------------------------------------------


def test_a_longest_node_kind_name_plans_checks_and_launches(tmp_path):
    kind = "k" * 256
    cluster = {
        "cluster": "long",
        "resources": {"cpu": {"unit": "core"}, "v100": {"unit": "GPU"}},
        "nodes": {kind: {"price": 3.0, "units": {"cpu": 40, "v100": 2}, "available": 2}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster))
    plan = tmp_path / "plan.yaml"
    assert runner.invoke(app, ["plan", CTR, str(path), "-s", "exact", "--out", str(plan)]).exit_code == 0
    check = runner.invoke(app, ["check", str(plan), "--profile", CTR, "--cluster", str(path)])
    assert check.exit_code == 0, check.output
    launch = runner.invoke(app, ["launch", str(plan), "-o", str(tmp_path / "l"), "--map", "v100=cuda"])
    assert launch.exit_code == 0, launch.output


def test_heterps_cluster_refuses_what_every_plan_command_would(runner, tmp_path):
    result = runner.invoke(app, ["cluster", "p5.48xlarge=10001"])  # one more rental than any search takes
    assert result.exit_code == 2 and "COUNT" in result.stderr and "plan command would refuse" in result.stderr
    catalogue = yaml.safe_load((ROOT / "heterps_cli/instances.yaml").read_text())
    tiny = catalogue["instances"]["c7i.24xlarge"]
    tiny["network_gbps"] = 1e-3  # a thousandth of a Gbit/s over 48 units: 2e-5 each
    (tmp_path / "cat.yaml").write_text(yaml.safe_dump(catalogue, allow_unicode=True))
    out = tmp_path / "c.yaml"
    result = runner.invoke(
        app, ["cluster", "c7i.24xlarge=2", "--catalogue", str(tmp_path / "cat.yaml"), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["resources"]["cpu"]["bandwidth_gbps"] > 0
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0


@pytest.mark.slow  # profiles a model: torch and a few seconds
def test_profiled_layer_names_fit_the_name_rule(tmp_path):
    deep = "a" * 120
    factory = tmp_path / "deep.py"
    factory.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def make(batch_size):\n"
        f"    inner = nn.Sequential(); inner.add_module('{deep}', nn.Linear(4, 4))\n"
        f"    middle = nn.Sequential(); middle.add_module('{deep}', inner)\n"
        f"    outer = nn.Sequential(); outer.add_module('{deep}', middle); outer.add_module('out', nn.Linear(4, 2))\n"
        "    return outer, torch.randn(batch_size, 4)\n"
    )
    out = tmp_path / "p.yaml"
    result = runner.invoke(app, ["profile", f"{factory}:make", "--as", "cpu", "--batch-size", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = [layer["name"] for layer in yaml.safe_load(out.read_text())["layers"]]
    assert max(len(n) for n in names) <= 256 and names[0].startswith("…") and names[0].endswith(deep)
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0


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


def test_no_library_warning_and_no_progress_bar_reach_a_log(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    env = {"MPLCONFIGDIR": str(blocked), "FORCE_COLOR": "1"}
    done = _heterps("compare", CTR, PAPER, "--schedulers", "greedy,exact", "--plot", str(tmp_path / "c.png"), env=env)
    assert done.returncode == 0, done.stderr
    assert "matplotlib" not in done.stderr.lower() and "mkdir" not in done.stderr
    assert "\x1b[?25l" not in done.stderr and "\r" not in done.stderr  # no bar drawn into the file


# 8. Reasons and figures ----------------------------------------------------------------------------


def test_an_overflowing_price_is_blamed_on_the_price(runner, tmp_path):
    text = (
        (ROOT / "clusters/aws-p3-nodes.yaml")
        .read_text()
        .replace("price: 3.06, units: {v100: 1", "price: 1.5e308, units: {v100: 1")
    )
    (tmp_path / "c.yaml").write_text(text)
    result = runner.invoke(app, ["plan", CTR, str(tmp_path / "c.yaml")])
    assert result.exit_code == 2 and re.search(r"c\.yaml:\d+: nodes\.p3\.2xlarge\.price: ", result.stderr)


def test_idle_units_list_every_unit_the_rental_holds(runner, tmp_path):
    cluster = yaml.safe_load((ROOT / "clusters/aws-p3-nodes.yaml").read_text())
    cluster["resources"]["tpu"] = {"unit": "TPU"}  # no layer of ctr runs on it
    for node in cluster["nodes"].values():
        node["units"]["tpu"] = 2
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    out = tmp_path / "plan.yaml"
    assert runner.invoke(app, ["plan", CTR, str(tmp_path / "c.yaml"), "-s", "exact", "--out", str(out)]).exit_code == 0
    plan = yaml.safe_load(out.read_text())
    assert plan["idle_units"]["tpu"] == 2 * sum(plan["rental"].values())
    assert plan["resources"]["tpu"] == 0 and plan["limits"]["tpu"] == 2 * sum(
        cluster["nodes"][k]["available"] for k in cluster["nodes"]
    )
    check = runner.invoke(app, ["check", str(out), "--profile", CTR, "--cluster", str(tmp_path / "c.yaml")])
    assert check.exit_code == 0, check.output


def test_a_frontier_thinned_past_its_knee_still_says_where_the_knee_is(runner):
    whole = json.loads(runner.invoke(app, ["frontier", CTR, PAPER, "--json"]).stdout)
    ends = json.loads(runner.invoke(app, ["frontier", CTR, PAPER, "--points", "2", "--json"]).stdout)
    assert whole["knee"] is not None and whole["knee_position"] == whole["knee"]
    assert ends["knee"] is None and ends["knee_position"] == whole["knee"]


def test_tick_labels_write_every_tick_as_it_is():
    assert tick_labels([10000, 12500, 15000, 17500, 20000]) == ["10.0k", "12.5k", "15.0k", "17.5k", "20.0k"]
    assert tick_labels([0.016, 0.018, 0.02], money=True) == ["$0.016", "$0.018", "$0.020"]
    assert tick_labels([2e6, 4e6, 6e6]) == ["2M", "4M", "6M"]


def test_diff_shows_what_the_rental_changed(runner, tmp_path):
    cheap, fast = tmp_path / "a.yaml", tmp_path / "b.yaml"
    nodes = str(ROOT / "clusters/aws-p3-nodes.yaml")
    assert runner.invoke(app, ["plan", CTR, nodes, "-s", "exact", "--out", str(cheap)]).exit_code == 0
    assert (
        runner.invoke(app, ["plan", CTR, nodes, "-s", "exact", "--objective", "time", "--out", str(fast)]).exit_code
        == 0
    )
    result = runner.invoke(app, ["diff", str(cheap), str(fast), "--format", "json"])
    changed = {c["what"] for c in json.loads(result.stdout)["changes"]}
    assert {"c5.18xlarge nodes", "rate USD/h"} <= changed, changed
