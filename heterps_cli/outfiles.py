"""Every file heterps writes goes through here: one file (``--out``), a set of files in a folder
(``frontier --out DIR``, ``launch --out-dir DIR``), or a checkpoint's files (:func:`new_file`,
:func:`publish`). Readers see the old files or the new ones, never half of a file nor two runs mixed,
and nothing is written through a link planted where a temporary file goes (docs/commands.md, "Files
heterps writes")."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from heterps_cli.errors import InputError

NAME_MAX = 255  # bytes of one path component on every file system heterps runs on
PATH_MAX = 4095  # bytes of a whole path, as Linux takes one (its PATH_MAX less the final NUL)


@dataclass(frozen=True)
class OutFile:
    """One file of a set: its contents and its mode before the umask (0o755 for a script)."""

    data: str | bytes
    mode: int = 0o644


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _cannot(shown: str, field: str | None, exc: OSError, what: str = "cannot write here") -> InputError:
    return InputError(shown, None, field, f"{what}: {exc.strerror or exc}")


def check_names(shown: str, field: str | None, path: str | os.PathLike) -> None:
    """Refuse a path no file system takes: a name in it over :data:`NAME_MAX` bytes, or the whole of it
    over :data:`PATH_MAX` once made absolute."""
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise InputError(
                shown, None, field, f"a name in this path is over {NAME_MAX} bytes, more than a file system allows"
            )
    if len(os.fsencode(os.path.abspath(path))) > PATH_MAX:
        raise InputError(
            shown[:80] + "…", None, field, f"the path is over {PATH_MAX} bytes, more than the system takes"
        )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _umasked(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


@contextmanager
def new_file(folder: Path, prefix: str, mode: int = 0o644) -> Iterator[tuple[BinaryIO, Path]]:
    """A file of ``folder`` under a new random name, and its path: created exclusively (``O_EXCL``
    refuses any entry already there, a planted symlink included, so nothing is written through
    one), synced to disk when the block ends, removed if it raises. The caller renames it into place
    (:func:`publish`)."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    path = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            yield fh, path
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def publish(tmp: Path, target: Path) -> None:
    """``tmp`` renamed over ``target`` and the rename itself synced; ``tmp`` removed if that fails."""
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(target.parent)


def _write_new(folder: Path, prefix: str, data: bytes, mode: int) -> Path:
    """``data`` in a new hidden file of ``folder`` (:func:`new_file`), synced to disk; its path."""
    with new_file(folder, prefix, mode) as (fh, path):
        fh.write(data)
    return path


def _target(path: str | os.PathLike, field: str | None) -> tuple[Path, os.stat_result | None]:
    """The file a write of ``path`` replaces (through the user's symlinks) and its state, or None where it
    is new; what no write can take (a directory's name, a name or path too long, a FIFO) refused."""
    shown = str(path)
    if shown.endswith(("/", os.sep)):
        raise InputError(shown, None, field, "names a directory: give a file name to write")
    check_names(shown, field, path)
    target = Path(os.path.realpath(path))  # through any symlinks, to the file a reader will open
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise _cannot(shown, field, exc) from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise InputError(
            shown,
            None,
            field,
            f"exists and is {_kind(existing.st_mode)}: refusing to replace it (give a file path, or - for standard "
            "output)",
        )
    return target, existing


def check_writable(path: str | os.PathLike, field: str | None = None) -> None:
    """Refuse, before any work, an output :func:`write_atomic` would refuse after it: a name it cannot
    take, or a folder it cannot write in (the nearest one that exists, where the rest is to be made)."""
    target, _ = _target(path, field)
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(str(path), None, field, f"cannot write here: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(str(path), None, field, f"cannot write here: {folder} is not writable")


def write_atomic(path: str | os.PathLike, data: str | bytes, field: str | None = None) -> None:
    """Write ``data`` so that readers see the old file or the new one, never half of it.

    A symlink the user names is followed and its target replaced (the link stays a link). A path
    that exists and is not a regular file (a directory, a FIFO, a device) is refused, and so is a
    path ending in a slash or holding a name too long for a file system. A new file gets mode 0644
    less the umask; a replaced file keeps its mode. If anything fails or the run is interrupted,
    the old file is left as it was.
    """
    shown = str(path)
    target, existing = _target(path, field)
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _umasked(0o644)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_new(target.parent, f".{target.name[:200]}.", _bytes(data), mode)
    except OSError as exc:
        raise _cannot(shown, field, exc) from None
    try:
        publish(tmp, target)
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot write") from None


def append_text(path: str | os.PathLike, text: str, field: str | None = None) -> None:
    """``text`` added at the end of a file someone else owns (``$GITHUB_STEP_SUMMARY``), created if
    missing; a directory, a FIFO (which would wait for a reader) or a device is refused."""
    shown = str(path)
    check_names(shown, field, path)
    try:
        existing = os.stat(path)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot append here") from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise InputError(shown, None, field, f"exists and is {_kind(existing.st_mode)}: refusing to append to it")
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot append") from None


# In a set's folder, one per command that writes sets there: the names and digests of the files its last set wrote.
MANIFEST = ".heterps-{kind}.json"
MAX_MANIFEST_BYTES = 1 << 20


def write_set(directory: str | os.PathLike, files: Mapping[str, OutFile], field: str, kind: str) -> list[Path]:
    """Write ``files`` (name -> contents) into ``directory`` as one set, and remove the files the
    previous set there wrote that this one does not, where they still hold what it wrote. Nothing else
    in the folder is touched: a file of the same kind of name that heterps did not write, or that was
    edited since, stays. Returns the paths written, in ``files``' order.

    What a set wrote is listed, with each file's SHA-256, in :data:`MANIFEST` for its ``kind`` (the
    command: ``launch``, ``frontier``), written with it, so one command's set never removes another's. All or
    nothing: every file is written to a staging folder inside ``directory`` first; then each old file
    is kept aside (a hard link) and the new one renamed over it, so each name always holds one whole
    file; a failure or an interrupt at any step puts every old file back. A rename replaces a directory
    entry, so a planted symlink ``DIR/node-0.sh`` is replaced by the new file, and nothing outside the
    folder is written through it. A name that is a directory in the folder is refused before anything
    is written."""
    folder = check_set_folder(directory, field)
    shown = str(folder)
    contents = {name: (_bytes(f.data), _umasked(f.mode)) for name, f in files.items()}
    manifest = MANIFEST.format(kind=kind)
    before = _written_before(folder, manifest)
    # A file of the user's that already holds these bytes (the plan launch copies, launched from that
    # copy's folder) stays theirs: listed, a later set would remove it.
    digests = {name: _digest(data) for name, (data, _) in contents.items()}
    ours = {name: d for name, d in digests.items() if name in before or _digest_of(folder / name) != d}
    listed = {"written_by": "heterps", "files": ours}
    everything = {**contents, manifest: ((json.dumps(listed, indent=1) + "\n").encode(), _umasked(0o644))}
    _refuse_directories(folder, everything, field)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".heterps-", dir=folder))
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot create the directory") from None
    try:
        fresh = {name: _write_new(staging, ".new.", data, mode) for name, (data, mode) in everything.items()}
        old = [name for name in before if name not in everything]
        with signals_held():  # a Ctrl-C or SIGTERM lands after the swap and its clean-up, not between them
            try:
                _swap(folder, staging / "previous", fresh, old)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot write the files (the folder is as it was)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in files]


def check_set_folder(directory: str | os.PathLike, field: str) -> Path:
    """A folder :func:`write_set` can write a set into, refused before any work where it cannot: a name
    too long, a file where the folder goes."""
    folder = Path(directory)
    check_names(str(folder), field, folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(str(folder), None, field, "exists and is not a directory: give a directory for the files")
    return folder


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _written_before(folder: Path, manifest: str) -> list[str]:
    """The files of ``folder`` that the last set written there wrote and that still hold what it wrote
    (regular files, not links): what :func:`write_set` may remove. A manifest it cannot read lists none."""
    try:
        listed = json.loads(read_regular(folder / manifest, MAX_MANIFEST_BYTES)[:MAX_MANIFEST_BYTES])
        files = listed["files"]
        assert isinstance(files, dict)
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AssertionError):
        return []
    return [
        name
        for name, digest in files.items()
        if isinstance(name, str)
        and name not in ("", ".", "..", manifest)
        and "/" not in name
        and "\0" not in name
        and _digest_of(folder / name) == digest
    ]


def _digest_of(path: Path) -> str | None:
    """The SHA-256 of a regular file (not a link), or None."""
    try:
        return _digest(read_regular(path, os.lstat(path).st_size))
    except OSError:
        return None


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of ``path``, a regular file: never through a link, never waiting on a
    FIFO someone put there (OSError for either, or for anything else that is not a file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return fh.read(limit + 1)


def _refuse_directories(folder: Path, files: Mapping[str, object], field: str) -> None:
    """A name of the set that is a directory in ``folder``: refused before anything is written."""
    for name in files:
        assert "/" not in name and name not in (".", "..")
        try:
            existing = os.lstat(folder / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _cannot(str(folder / name), field, exc) from None
        if stat.S_ISDIR(existing.st_mode):
            raise InputError(
                str(folder / name), None, field, "exists and is a directory: refusing to replace it (nothing written)"
            )


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs (in the main thread, where Python handles
    them), and delivered when it ends: a step that must finish whole once begun."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Python's handlers, not the thread's signal mask: another thread (torch's) would take a masked signal.
    pending: list[int] = []
    before = {
        s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if pending:
            signal.raise_signal(pending[0])


def _swap(folder: Path, aside: Path, fresh: dict[str, Path], old: list[str]) -> None:
    """The ``fresh`` files (name -> staged path) renamed into ``folder`` over their old entries, and
    the ``old`` names moved away; on any failure or interrupt, every old entry put back."""
    kept: list[str] = []  # old entries kept aside (a hard link, or moved), to put back on failure
    gone: list[str] = []  # of those, the ones no longer in the folder (moved away, or replaced)
    placed: list[str] = []  # new files renamed into the folder
    try:
        aside.mkdir()
        for name in fresh:  # a second name for the old entry: readers still see it until it is replaced
            if os.path.lexists(folder / name):
                if _moved_aside(folder / name, aside / name):
                    gone.append(name)
                kept.append(name)
        for name, tmp in fresh.items():
            os.rename(tmp, folder / name)  # replaces the entry itself: a symlink stays unfollowed
            placed.append(name)
            if name in kept and name not in gone:
                gone.append(name)
        for name in old:
            os.rename(folder / name, aside / name)
            kept.append(name)
            gone.append(name)
        sync_folder(folder)
    except BaseException:
        for name in placed:
            if name not in kept:
                (folder / name).unlink(missing_ok=True)
        for name in gone:
            os.rename(aside / name, folder / name)
        raise


def _moved_aside(entry: Path, aside: Path) -> bool:
    """``entry`` (a file or a symlink, never followed) also at ``aside``: a hard link where the file
    system allows one, so the folder keeps the old file until the new one replaces it (False); else
    moved there (True)."""
    try:
        os.link(entry, aside, follow_symlinks=False)
    except OSError:
        os.rename(entry, aside)
        return True
    return False


def sync_folder(folder: Path) -> None:
    """The renames themselves on disk, where the system allows a directory to be synced."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
