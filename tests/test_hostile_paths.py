"""What an attacker or a careless user can do with paths (docs/commands.md, "Files heterps writes"
and "What heterps refuses, and why"): a test per class of failure, not per example.

1. every byte that reaches a shell is quoted (launch scripts run as written, nothing injected);
2. every file is written by one writer (no symlink followed in a folder, all or nothing, no stale file);
5. heterps never writes a file it would refuse.

Classes 3 and 8 are in tests/test_hostile_plans.py, 4, 6 and 7 in tests/test_hostile_terminal.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from heterps_cli.outfiles import MANIFEST as MANIFESTS
from tests.helpers import ONE_NODE, ONE_NODE_MAP, PLACED, PLACED_MAP, ROOT, runner

MANIFEST = MANIFESTS.format(kind="launch")

CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")
PLAN = str(ROOT / "docs/plans/ctr.yaml")


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
    # one task per component: its node 0
    _stub(bin_dir, "srun", '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    _stub(bin_dir, "scontrol", "#!/bin/sh\necho node-a\n")
    nodes = {"SLURM_JOB_NODELIST": "node-a", "SLURM_JOB_NODELIST_HET_GROUP_0": "node-a"}
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **nodes}
    return record, env


HOSTILE_PLAN_NAMES = ["p\ntouch INJECTED\n.yaml", "-x.yaml", "$(touch INJECTED).yaml", "`touch INJECTED`.yaml"]


@pytest.mark.parametrize("name", HOSTILE_PLAN_NAMES)
def test_launch_scripts_pass_every_word_as_written_and_run_nothing_else(tmp_path, fake_cluster, name):
    record, env = fake_cluster
    plan = tmp_path / name
    plan.write_bytes(PLACED.read_bytes())
    out = tmp_path / "launch"
    (tmp_path / "$HOME;touch INJECTED.py").write_text(
        "from heterps_cli.profiling.zoo import vgg16\n\n\ndef model():\n    return vgg16(128)\n"
    )
    model = f"{tmp_path}/$HOME;touch INJECTED.py:model"
    args = ["launch", str(plan), "-o", str(out), "--model", model, *PLACED_MAP]
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
    assert len(runs) == 7  # five nodes, then node 0 of each of Slurm's two components
    for argv in runs:
        tail = argv[argv.index("heterps_cli") :]
        assert tail[:3] == ["heterps_cli", "run", str(out / "plan.yaml")]  # the copy: absolute, never an option
        assert tail[tail.index("--model") + 1] == model
        assert argv[argv.index("--master-addr") + 1] in ("10.1.2.3", "node-a")
    assert (out / "plan.yaml").read_bytes() == PLACED.read_bytes()


def test_the_slurm_script_ends_every_step_when_a_node_fails(tmp_path, fake_cluster):
    """Node 4 (the second component's) fails at once: the job ends with it, not when node 0's run times out."""
    _, env = fake_cluster
    fails = '#!/bin/sh\ncase " $* " in *" --node-rank 4 "*) exit 3 ;; esac\nexec sleep 60\n'
    _stub(tmp_path / "bin", "torchrun", fails)
    out = tmp_path / "launch"
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]).exit_code == 0
    started = time.monotonic()
    done = subprocess.run(["bash", str(out / "launch.sbatch")], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 1 and "a node failed: ending the job" in done.stderr
    assert time.monotonic() - started < 30


# 2. Files ------------------------------------------------------------------------------------------


def test_a_planted_symlink_in_the_folder_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    out = tmp_path / "launch"
    out.mkdir()
    (out / "node-0.sh").symlink_to(outside)
    (out / "plan-001.yaml").symlink_to(outside)
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]).exit_code == 0
    assert runner.invoke(app, ["frontier", CTR, PAPER, "--out", str(out)]).exit_code == 0
    assert outside.read_text() == "keep me" and not os.access(outside, os.X_OK)
    for name in ("node-0.sh", "plan-001.yaml"):
        assert stat.S_ISREG(os.lstat(out / name).st_mode)


def test_a_rerun_leaves_only_its_own_files_and_the_users(tmp_path):
    out = tmp_path / "launch"
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]).exit_code == 0
    (out / "notes.txt").write_text("mine")
    one_node = ONE_NODE
    assert runner.invoke(app, ["launch", str(one_node), "-o", str(out), *ONE_NODE_MAP]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "launch.sbatch", "node-0.sh", "notes.txt", "plan.yaml"]
    assert (out / "plan.yaml").read_bytes() == one_node.read_bytes()


def test_a_launch_removes_only_what_the_last_one_wrote_and_nobody_changed(tmp_path):
    """Files named as heterps names its own, but not written by it (another plan, a digit that is not
    ASCII), or written by it and edited since, stay: only the manifest's unchanged files are removed."""
    out = tmp_path / "launch"
    out.mkdir()
    theirs = {"plan.json": "another plan", "node-\u0661.sh": "mine", "node-7.sh": "mine too"}
    for name, text in theirs.items():
        (out / name).write_text(text)
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]).exit_code == 0
    (out / "node-1.sh").write_text((out / "node-1.sh").read_text() + "# edited by hand\n")
    one_node = ONE_NODE
    assert runner.invoke(app, ["launch", str(one_node), "-o", str(out), *ONE_NODE_MAP]).exit_code == 0
    left = {p.name for p in out.iterdir()}
    assert left == {MANIFEST, "launch.sbatch", "node-0.sh", "plan.yaml", "node-1.sh", *theirs}
    assert all((out / name).read_text() == text for name, text in theirs.items())
    (out / "node-1.sh").unlink()
    assert runner.invoke(app, ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]).exit_code == 0
    assert runner.invoke(app, ["launch", str(one_node), "-o", str(out), *ONE_NODE_MAP]).exit_code == 0
    assert not (out / "node-1.sh").exists()  # the last launch wrote it, unchanged since


def test_a_plan_launched_from_the_launch_folder_stays_the_users(tmp_path):
    """launch copies the plan to DIR/plan.yaml: launched from DIR/plan.yaml itself, the copy is the user's
    own file, which a later launch of another plan into DIR must not remove."""
    out = tmp_path / "launch"
    out.mkdir()
    (out / "plan.yaml").write_bytes(PLACED.read_bytes())
    assert runner.invoke(app, ["launch", str(out / "plan.yaml"), "-o", str(out), *PLACED_MAP]).exit_code == 0
    other = tmp_path / "other.json"
    other.write_text(json.dumps(yaml.safe_load(ONE_NODE.read_text())))
    assert runner.invoke(app, ["launch", str(other), "-o", str(out), *ONE_NODE_MAP]).exit_code == 0
    assert (out / "plan.yaml").read_bytes() == PLACED.read_bytes() and (out / "plan.json").exists()


@pytest.mark.parametrize("command", ["launch", "frontier"])
def test_a_set_of_files_is_written_whole_or_not_at_all(tmp_path, monkeypatch, command):
    from heterps_cli import outfiles

    out = tmp_path / "out"
    args = (
        ["launch", str(PLACED), "-o", str(out), *PLACED_MAP]
        if command == "launch"
        else ["frontier", CTR, PAPER, "--out", str(out)]
    )
    assert runner.invoke(app, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    rename = outfiles.os.rename

    def fails_late(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # after one new file replaced its old one
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


# 5. heterps writes only what it reads ------------------------------------------------------------


def test_a_longest_node_kind_name_plans_checks_and_launches(tmp_path):
    kind = "k" * 256
    cluster = {
        "cluster": "long",
        "resources": {"cpu": {"unit": "core"}, "l4": {"unit": "GPU"}},
        "nodes": {kind: {"price": 3.0, "units": {"cpu": 40, "l4": 2}, "available": 2}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster))
    plan, profile, job = tmp_path / "plan.yaml", str(ROOT / "profiles/vgg16-aws.yaml"), ["--samples", "100000"]
    made = runner.invoke(app, ["plan", profile, str(path), "-s", "exact", *job, "--out", str(plan)])
    assert made.exit_code == 0, made.output
    check = runner.invoke(app, ["check", str(plan), "--profile", profile, "--cluster", str(path), *job])
    assert check.exit_code == 0, check.output
    launch = runner.invoke(app, ["launch", str(plan), "-o", str(tmp_path / "l"), *ONE_NODE_MAP])
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


# -- files damaged or lost -----------------------------------------------------------------------------


def test_frontier_out_never_writes_through_a_planted_link(runner, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    folder = tmp_path / "fr"
    folder.mkdir()
    (folder / "plan-001.yaml").symlink_to("../outside.txt")
    result = runner.invoke(app, ["frontier", CTR, PAPER, "--out", str(folder)])
    assert result.exit_code == 0, result.output
    assert outside.read_text() == "not yours\n"
    assert not (folder / "plan-001.yaml").is_symlink() and "stages" in (folder / "plan-001.yaml").read_text()


@pytest.mark.parametrize("step", ["_write_new", "rename"])
def test_a_frontier_out_that_fails_partway_leaves_the_folder_as_it_was(runner, tmp_path, monkeypatch, step):
    """A disk that fills while the new plans are written, or while they are renamed into place: the
    folder holds the previous run's plans, byte for byte, and nothing else."""
    from heterps_cli import outfiles

    folder = tmp_path / "fr"
    assert runner.invoke(app, ["frontier", CTR, PAPER, "--out", str(folder)]).exit_code == 0
    before = {p.name: p.read_text() for p in folder.iterdir()}
    calls = {"n": 0}
    target = outfiles if step == "_write_new" else outfiles.os
    original = getattr(target, step)

    def fails_on_the_fifth(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(28, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, step, fails_on_the_fifth)
    result = runner.invoke(app, ["frontier", CTR, PAPER, "--min-throughput", "2e6", "--out", str(folder)])
    assert result.exit_code == 2 and "cannot write the files (the folder is as it was)" in result.stderr, result.output
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_plan_out_is_never_its_own_input(runner, tmp_path):
    profile = tmp_path / "p.yaml"
    shutil.copy(CTR, profile)
    text = profile.read_text()
    result = runner.invoke(app, ["plan", str(profile), PAPER, "-s", "greedy", "--out", str(profile)])
    assert result.exit_code == 2 and "an input of this command" in result.stderr
    assert profile.read_text() == text


@pytest.mark.slow  # 2 s or more of the fast suite on 2 cores; .ci/run runs it
@pytest.mark.parametrize("args", [["--json"], [], ["--out", "-"]])
def test_a_plan_that_cannot_reach_standard_output_is_an_error(args):
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "heterps_cli", "plan", CTR, PAPER, "-s", "exact", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "error: cannot write standard output (No space left on device): what heterps printed there is incomplete"
    )


def test_closed_standard_output_is_refused_before_any_work():
    done = subprocess.run(
        [sys.executable, "-m", "heterps_cli", "plan", CTR, PAPER, "-s", "exact", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 2 and "standard output is closed" in done.stderr, done.stderr


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "no-hard-links"])
def test_a_set_fails_at_any_rename_and_the_folder_is_as_it_was(tmp_path, monkeypatch, links):
    """Every rename of the swap failing in turn, where the file system takes hard links and where it
    does not (the old files are then moved aside): either the whole new set, or the old one."""
    from heterps_cli import outfiles
    from heterps_cli.errors import InputError
    from heterps_cli.outfiles import OutFile, write_set

    for fail_at in range(1, 8):
        folder = tmp_path / str(fail_at)
        write_set(folder, {f"a-{i}": OutFile(f"old{i}") for i in (1, 2, 3)}, "--out", "launch")
        before = {p.name: p.read_text() for p in folder.iterdir()}
        calls, rename = {"n": 0}, os.rename

        def fails(*args, fail_at=fail_at, rename=rename, calls=calls, **kwargs):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise OSError(5, "Input/output error")
            return rename(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(outfiles.os, "rename", fails)
            if not links:
                patch.setattr(outfiles.os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(1, "EPERM")))
            try:
                write_set(folder, {"a-1": OutFile("new1"), "a-2": OutFile("new2")}, "--out", "launch")
                wrote = True
            except InputError:
                wrote = False
        after = {p.name: p.read_text() for p in folder.iterdir() if p.name != MANIFEST}
        before.pop(MANIFEST, None)
        assert after == ({"a-1": "new1", "a-2": "new2"} if wrote else before), fail_at
