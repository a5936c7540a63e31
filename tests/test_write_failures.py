"""A write that fails names what it was writing (docs/spec.md section 5): a full checkpoint folder is not
blamed on standard output, and standard output is blamed only where it is the one without room."""

from __future__ import annotations

import errno
import os
import sys

import pytest

from heterps_cli.cli import session
from heterps_cli.errors import InputError
from heterps_cli.runtime import checkpoint


def _full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_checkpoint_folder_names_its_lock_not_standard_output(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.os, "pwrite", _full)
    with pytest.raises(InputError) as raised, checkpoint.locked(tmp_path):
        pass
    said = " ".join(raised.value.lines())
    assert str(tmp_path) in said and "cannot write the folder's lock" in said and "standard output" not in said


def test_a_write_failure_blames_standard_output_only_where_it_has_no_room(tmp_path, monkeypatch):
    with open(tmp_path / "stdout.txt", "w") as roomy:
        monkeypatch.setattr(sys, "stdout", roomy)
        said = session._write_failure(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        assert "not to standard output" in said
        named = session._write_failure(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "ck")))
        assert named.startswith(f"cannot write {tmp_path / 'ck'}")
        monkeypatch.setattr(session, "_has_room", lambda stream: False)
        assert session._write_failure(OSError(errno.ENOSPC, "full")).startswith("cannot write standard output")


def test_a_sigterm_while_a_set_is_swapped_in_lands_after_the_swap_and_its_clean_up(tmp_path, monkeypatch):
    """Once the new set starts to replace the old, a signal waits for the swap and the removal of the
    staging folder: the folder then holds the new set alone, never the old files left aside."""
    import signal

    from heterps_cli import outfiles
    from heterps_cli.outfiles import OutFile, write_set

    write_set(tmp_path, {"plan-001.yaml": OutFile("old\n")}, "--out", "frontier")
    swap = outfiles._swap

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return swap(*args, **kwargs)

    class Terminated(Exception):
        pass

    def terminate(*_):
        raise Terminated

    monkeypatch.setattr(outfiles, "_swap", signalled)
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with pytest.raises(Terminated):
            write_set(tmp_path, {"plan-002.yaml": OutFile("new\n")}, "--out", "frontier")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".heterps-frontier.json", "plan-002.yaml"]
