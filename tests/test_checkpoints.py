"""Checkpoints that are complete or absent (docs/spec.md section 4b): staged and renamed whole, every file
naming its run and step, one run per folder, a damaged checkpoint never read nor removed, and the folder
checked before any process starts."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from heterps_cli.cli.app import app
from heterps_cli.errors import InputError
from heterps_cli.runtime import checkpoint
from tests.helpers import ROOT, runner, write_plan

META = {"stages": [["cpu", 1, ["0"]]], "batch_size": 4, "micro_batches": 2, "seed": 0, "model": "m", "tp": [1]}
NAMES = ["stage-0.pt", "rng-0.pt"]
CLASSIFY = f"{ROOT / 'docs/guide/classify.py'}:task"


def _checkpoint(root: Path, steps: int, run: str = "a" * 32, meta: dict | None = None) -> Path:
    """A checkpoint as a run of one process writes it."""
    where = checkpoint.staging(root, steps, run)
    checkpoint.save({"model": {"w": torch.full((2,), float(steps))}, "optimizer": {}}, where / NAMES[0], run, steps)
    checkpoint.save({"cpu": torch.get_rng_state()}, where / NAMES[1], run, steps)
    checkpoint.complete(str(root), steps, run, NAMES, meta or META)
    return checkpoint.folder(root, steps)


def test_the_newest_complete_checkpoint_is_taken_and_another_runs_refused(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    for steps in (2, 4, 6):
        _checkpoint(root, steps)
    staged = checkpoint.staging(root, 8, "b" * 32)  # a save that was killed: never renamed into place
    checkpoint.save({"x": torch.zeros(1)}, staged / "stage-0.pt", "b" * 32, 8)
    assert checkpoint.latest(root, META) == (6, checkpoint.folder(root, 6), False)
    assert sorted(p.name for p in root.iterdir()) == [staged.name, "step-000004", "step-000006"]  # two kept
    with pytest.raises(InputError, match="written by another job"):
        checkpoint.latest(root, {**META, "seed": 1})
    # another plan of the same job, from a checkpoint without the whole model: refused, naming what differs
    with pytest.raises(InputError, match=r"another plan \(tp \[1\] there, \[2\] now\).*model.pt"):
        checkpoint.latest(root, {**META, "tp": [2]})
    old = {k: v for k, v in META.items() if k != "tp"}  # written before degrees were kept: at tp 1
    (root / "step-000006" / "complete.json").write_text(json.dumps({**old, "steps_done": 6}))
    assert checkpoint.latest(root, META) == (6, checkpoint.folder(root, 6), False)
    assert checkpoint.latest(tmp_path / "none", META) is None
    with checkpoint.locked(root):  # what a killed run left staged goes once the folder is held
        assert not staged.exists()


def test_a_task_named_by_another_path_to_the_same_file_is_the_same_task(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    root.mkdir()
    (tmp_path / "t.py").write_text("")
    monkeypatch.chdir(tmp_path)
    _checkpoint(root, 2, meta={**META, "model": "t.py:task"})  # as run --task t.py:task wrote it
    assert checkpoint.latest(root, {**META, "model": checkpoint.spec_identity(f"{tmp_path}/t.py:task")})
    with pytest.raises(InputError, match="written by another job"):
        checkpoint.latest(root, {**META, "model": f"{tmp_path}/u.py:task"})


def test_a_checkpoint_with_the_whole_model_resumes_under_another_plan_of_the_same_job_only(tmp_path):
    """Another cut, degree or micro-batch of the same job: resumed from model.pt; another seed, model or
    number of samples a step: refused, naming it, the folder as it was."""
    root = tmp_path / "ck"
    root.mkdir()
    where = checkpoint.staging(root, 2, "a" * 32)
    checkpoint.save({"model": {}, "optimizer": {}}, where / NAMES[0], "a" * 32, 2)
    checkpoint.save({"cpu": torch.get_rng_state()}, where / NAMES[1], "a" * 32, 2)
    for name in ("model.pt", "optimizer.pt"):
        checkpoint.save({}, where / name, "a" * 32, 2, stamped=False)
    checkpoint.complete(str(root), 2, "a" * 32, [*NAMES, "model.pt", "optimizer.pt"], META)
    before = sorted((p.name, p.stat().st_size) for p in (root / "step-000002").iterdir())
    other = {**META, "stages": [["cpu", 2, ["0"]]], "tp": [2], "batch_size": 2, "micro_batches": 4}
    assert checkpoint.latest(root, other) == (2, checkpoint.folder(root, 2), True)
    with pytest.raises(InputError, match=r"trained 8 samples a step \(2 x 4\), this plan 16 \(4 x 4\)"):
        checkpoint.latest(root, {**META, "micro_batches": 4})
    with pytest.raises(InputError, match="seed 0 there, 3 now"):
        checkpoint.latest(root, {**other, "seed": 3})
    assert sorted((p.name, p.stat().st_size) for p in (root / "step-000002").iterdir()) == before


@pytest.mark.parametrize(
    "text, said",
    [
        (b"\x00\xff garbage", "not whole JSON"),
        (b'{"stages": [["cpu", 1', "not whole JSON"),
        (b"[" * 200_000 + b"]" * 200_000, "not JSON heterps wrote"),
        (b'{"steps_done": 3}', "does not say 4"),
        (b'{"steps_done": 4, "files": {"stage-0.pt": "big"}}', "not a list of file names"),
    ],
    ids=["garbage", "cut short", "nested 200,000 deep", "another step", "files"],
)
def test_a_damaged_complete_json_stops_a_resume_and_is_never_pruned(tmp_path, text, said):
    root = tmp_path / "ck"
    root.mkdir()
    _checkpoint(root, 2)
    (_checkpoint(root, 4) / "complete.json").write_bytes(text)
    with pytest.raises(InputError, match=f"{said}.*remove the folder step-000004"):
        checkpoint.latest(root, META)
    with pytest.raises(InputError, match="already holds checkpoints"):
        checkpoint.refuse_fresh(root)
    for steps in (6, 8, 10):  # newer checkpoints prune the old complete ones, never the damaged one
        _checkpoint(root, steps)
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000008", "step-000010"]


def test_a_file_missing_resized_or_of_another_run_is_refused_by_name(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    where = _checkpoint(root, 2)
    mark = checkpoint.read_mark(where)
    assert checkpoint.read(where / "stage-0.pt", mark)["model"]["w"].tolist() == [2.0, 2.0]
    (tmp_path / "other").mkdir()
    other = _checkpoint(tmp_path / "other", 2, run="c" * 32)
    os.replace(other / "rng-0.pt", where / "rng-0.pt")  # same size, same step, another run's
    with pytest.raises(RuntimeError, match=r"rng-0.pt: written by another run or step .* the checkpoint is mixed"):
        checkpoint.read(where / "rng-0.pt", mark)
    (where / "stage-0.pt").write_bytes(b"cut")
    with pytest.raises(InputError, match=r"stage-0.pt: is not the file complete.json lists"):
        checkpoint.latest(root, META)
    (where / "stage-0.pt").unlink()
    with pytest.raises(InputError, match=r"stage-0.pt: is missing"):
        checkpoint.latest(root, META)
    garbage = where / "stage-0-shard-1.pt"
    garbage.write_bytes(bytes(range(256)))
    with pytest.raises(RuntimeError, match=r"shard-1.pt: not a checkpoint file .* remove the folder step-000002"):
        checkpoint.read(garbage)


def test_a_stage_file_of_other_keys_or_shapes_or_a_bad_generator_file_is_refused_by_name(tmp_path):
    module = torch.nn.Linear(2, 2)
    optimiser = torch.optim.SGD(module.parameters(), lr=0.1)
    path = tmp_path / "step-000002" / "stage-0.pt"
    for state in ({"optimizer": {}}, {"model": torch.nn.Linear(3, 2).state_dict(), "optimizer": {}}):
        with pytest.raises(RuntimeError, match=r"stage-0.pt: does not hold this stage's weights .* step-000002"):
            checkpoint.load_stage_state(module, optimiser, state, path)
    with pytest.raises(RuntimeError, match=r"rng-0.pt: does not hold a process's random generators"):
        checkpoint.set_generators({"cpu": torch.zeros(3)}, torch.device("cpu"), path.with_name("rng-0.pt"))


def test_a_save_that_fails_says_why_naming_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    from heterps_cli import outfiles

    real = outfiles.tempfile.mkstemp

    def full(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr(outfiles.tempfile, "mkstemp", full)
    where = checkpoint.staging(tmp_path, 2, "a" * 32)
    with pytest.raises(RuntimeError, match=r"stage-0.pt: cannot write the checkpoint file: No space left on device"):
        checkpoint.save({"w": torch.zeros(100_000)}, where / "stage-0.pt", "a" * 32, 2)
    assert list(where.iterdir()) == []


def test_nothing_is_written_through_links_planted_where_checkpoint_files_go(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    root = tmp_path / "ck"
    (root / "step-000002").mkdir(parents=True)  # another user of a shared folder, before the run
    for name in (".complete.json.tmp", "complete.json", "stage-0.pt", "rng-0.pt"):
        (root / "step-000002" / name).symlink_to(victim)
    (root / "step-000004").symlink_to(tmp_path)
    _checkpoint(root, 2)
    _checkpoint(root, 4)
    assert victim.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["ck", "victim"]
    assert checkpoint.latest(root, META) == (4, checkpoint.folder(root, 4), False)
    assert not checkpoint.folder(root, 4).is_symlink()


def test_one_run_at_a_time_writes_into_a_folder(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1", "2", "3", "4"])], 32)
    with checkpoint.locked(root):
        result = runner.invoke(app, ["run", str(plan), "--task", CLASSIFY, "--checkpoint-dir", str(root)])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and f"another heterps run (pid {os.getpid()} on" in shown, shown
    assert "is writing checkpoints here" in shown
    (root / checkpoint.LOCK).unlink()
    (root / checkpoint.LOCK).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="cannot open the folder's lock: it is a symbolic link"):
        with checkpoint.locked(root):
            pass
    assert not (tmp_path / "elsewhere").exists()


def test_a_checkpoint_folder_no_save_could_use_is_refused_before_any_process_starts(tmp_path):
    plan = write_plan(tmp_path / "plan.json", [("cpu", 1, ["0", "1", "2", "3", "4"])], 32)
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = {
        str(tmp_path / "file"): "exists and is not a directory",
        str(tmp_path / "dangling"): "is a link to",
        str(tmp_path / ("x" * 300)): "over 255 bytes",
        "/proc/heterps-ck": "cannot create the folder",
    }
    for folder, said in cases.items():
        result = runner.invoke(app, ["run", str(plan), "--task", CLASSIFY, "--checkpoint-dir", folder])
        shown = " ".join(result.output.split())
        assert result.exit_code == 2 and said in shown and "--checkpoint-dir" in shown, shown
        assert "loss" not in shown  # refused before any training
    if os.geteuid() != 0 and sys.platform == "linux":  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        result = runner.invoke(app, ["run", str(plan), "--checkpoint-dir", str(locked)])
        assert result.exit_code == 2 and "not writable" in result.output


def test_a_fifo_planted_where_heterps_reads_or_locks_is_refused_not_waited_on(tmp_path):
    """A FIFO as complete.json, a stage file, the lock or a launch manifest would hold an open() forever."""
    root = tmp_path / "ck"
    root.mkdir()
    where = _checkpoint(root, 2)
    (where / "complete.json").unlink()
    os.mkfifo(where / "complete.json")
    with pytest.raises(InputError, match="complete.json: cannot be read: not a regular file"):
        checkpoint.latest(root, META)
    (where / "complete.json").unlink()
    (where / "stage-0.pt").unlink()
    os.mkfifo(where / "stage-0.pt")
    with pytest.raises(RuntimeError, match="stage-0.pt: is not a regular file"):
        checkpoint.read(where / "stage-0.pt")
    os.mkfifo(root / checkpoint.LOCK)
    with pytest.raises(InputError, match="lock: it is not a regular file"):
        with checkpoint.locked(root):
            pass
    from heterps_cli.outfiles import MANIFEST, OutFile, write_set

    out = tmp_path / "launch"
    out.mkdir()
    os.mkfifo(out / MANIFEST.format(kind="launch"))  # read as listing nothing, and replaced
    write_set(out, {"a": OutFile("x")}, "--out-dir", "launch")
    listed = json.loads((out / MANIFEST.format(kind="launch")).read_text())["files"]
    assert listed == {"a": hashlib.sha256(b"x").hexdigest()}


def test_what_someone_put_where_a_step_folder_goes_is_replaced_and_removed(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    (root / "step-000002").write_text("a file, not a checkpoint")
    _checkpoint(root, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step-000002"]  # nothing left aside
    assert checkpoint.latest(root, META) == (2, checkpoint.folder(root, 2), False)
