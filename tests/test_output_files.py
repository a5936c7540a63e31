"""Output files: --out through symlinks, onto a FIFO or a directory, to standard output, and the
modes they get. No file is lost or damaged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from heterps_cli.cli.app import app
from tests.helpers import ROOT, runner

HOSTILE = Path(__file__).parent / "data" / "hostile"
CTR, PAPER = str(ROOT / "profiles/ctr.yaml"), str(ROOT / "clusters/paper.yaml")


def _plan_to(out: str, *extra: str):
    return runner.invoke(app, ["plan", CTR, PAPER, "-s", "exact", "--out", out, *extra])


def test_out_follows_a_symlink_and_replaces_its_target(tmp_path):
    (tmp_path / "target.yaml").write_text("old\n")
    (tmp_path / "link.yaml").symlink_to("target.yaml")
    assert _plan_to(str(tmp_path / "link.yaml")).exit_code == 0
    assert (tmp_path / "link.yaml").is_symlink()
    assert yaml.safe_load((tmp_path / "target.yaml").read_text())["scheduler"] == "exact"


def test_out_refuses_a_fifo_and_a_directory_before_the_search(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = _plan_to(str(fifo))
    assert result.exit_code == 2 and "exists and is a FIFO" in result.stderr, result.output
    assert "throughput" not in result.stdout, "refused before any plan is searched for"
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


@pytest.mark.parametrize(
    "args, said",
    [
        (["plan", CTR, PAPER, "--policy-out", "{tmp}"], "--policy-out: exists and is a directory"),
        (["frontier", CTR, PAPER, "--plot", "{tmp}"], "--plot: exists and is a directory"),
        (["frontier", CTR, PAPER, "--out", "{tmp}/file"], "--out: exists and is not a directory"),
        (["compare", CTR, PAPER, "--plot", "{tmp}"], "--plot: exists and is a directory"),
        (["profile", "mlp", "--as", "cpu", "--batch-size", "4", "--out", "{tmp}"], "--out: exists and is a directory"),
        (["profile", "estimate", "mlp", "t4", "--as", "t4", "--batch-size", "4", "--out", "{tmp}"], "is a directory"),
        (["plan", CTR, PAPER, "--out", "{tmp}/" + "d/" * 2100 + "p.yaml"], "the path is over 4095 bytes"),
    ],
    ids=["policy-out", "frontier plot", "frontier out", "compare plot", "profile", "estimate", "a long path"],
)
def test_an_output_no_write_could_take_is_refused_before_the_work(tmp_path, args, said):
    """The search, the frontier, the measuring or the estimate would otherwise run first, then fail."""
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    shown = " ".join(result.output.split())
    assert result.exit_code == 2 and said in shown and "throughput" not in shown, shown
    assert "layers" not in result.stdout  # nothing measured, planned or shown
