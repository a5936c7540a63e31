"""Every file heterps writes goes through here: one file (``--out``), or a set of files in a folder
(``frontier --out DIR``, ``launch --out-dir DIR``). Readers see the old files or the new ones, never
half of a file nor two runs mixed (docs/commands.md, "Files heterps writes")."""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from heterps_cli.errors import InputError

NAME_MAX = 255  # bytes of one path component on every file system heterps runs on


@dataclass(frozen=True)
class OutFile:
    """One file of a set: its contents and its mode before the umask (0o755 for a script)."""

    data: str | bytes
    mode: int = 0o644


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _cannot(shown: str, field: str | None, exc: OSError, what: str = "cannot write here") -> InputError:
    return InputError(shown, None, field, f"{what}: {exc.strerror or exc}")


def _check_names(shown: str, field: str | None, path: str | os.PathLike) -> None:
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise InputError(
                shown, None, field, f"a name in this path is over {NAME_MAX} bytes, more than a file system allows"
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


def _write_new(folder: Path, prefix: str, data: bytes, mode: int) -> Path:
    """``data`` in a new hidden file of ``folder``, synced to disk; its path."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomic(path: str | os.PathLike, data: str | bytes, field: str | None = None) -> None:
    """Write ``data`` so that readers see the old file or the new one, never half of it.

    A symlink the user names is followed and its target replaced (the link stays a link). A path
    that exists and is not a regular file (a directory, a FIFO, a device) is refused, and so is a
    path ending in a slash or holding a name too long for a file system. A new file gets mode 0644
    less the umask; a replaced file keeps its mode. If anything fails or the run is interrupted,
    the old file is left as it was.
    """
    shown = str(path)
    if shown.endswith(("/", os.sep)):
        raise InputError(shown, None, field, "names a directory: give a file name to write")
    _check_names(shown, field, path)
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
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _umasked(0o644)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_new(target.parent, f".{target.name[:200]}.", _bytes(data), mode)
    except OSError as exc:
        raise _cannot(shown, field, exc) from None
    try:
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _cannot(shown, field, exc, "cannot write") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_text(path: str | os.PathLike, text: str, field: str | None = None) -> None:
    """``text`` added at the end of a file someone else owns (``$GITHUB_STEP_SUMMARY``), created if
    missing; a directory, a FIFO (which would wait for a reader) or a device is refused."""
    shown = str(path)
    _check_names(shown, field, path)
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


def write_set(
    directory: str | os.PathLike, files: Mapping[str, OutFile], stale: re.Pattern[str], field: str
) -> list[Path]:
    """Write ``files`` (name -> contents) into ``directory`` as one set, and remove the files a previous
    run left there: names ``stale`` matches that are not in ``files``. Nothing else in the folder is
    touched. Returns the paths written, in ``files``' order.

    All or nothing: every file is written to a staging folder inside ``directory`` first; then each
    old file is kept aside (a hard link) and the new one renamed over it, so each name always holds
    one whole file; a failure or an interrupt at any step puts every old file back. A rename
    replaces a directory entry, so a planted symlink ``DIR/node-0.sh`` is replaced by the new file,
    and nothing outside the folder is written through it. A name that is a directory in the folder
    is refused before anything is written."""
    folder = Path(directory)
    shown = str(folder)
    _check_names(shown, field, folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(shown, None, field, "exists and is not a directory: give a directory for the files")
    _refuse_directories(folder, files, field)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".heterps-", dir=folder))
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot create the directory") from None
    try:
        fresh = {name: _write_new(staging, ".new.", _bytes(f.data), _umasked(f.mode)) for name, f in files.items()}
        old = [p.name for p in folder.iterdir() if stale.fullmatch(p.name) and p.name not in files]
        _swap(folder, staging / "previous", fresh, old)
    except OSError as exc:
        raise _cannot(shown, field, exc, "cannot write the files (the folder is as it was)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in files]


def _refuse_directories(folder: Path, files: Mapping[str, OutFile], field: str) -> None:
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
        _sync(folder)
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


def _sync(folder: Path) -> None:
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
