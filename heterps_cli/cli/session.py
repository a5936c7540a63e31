"""What every command shares while it runs: the consoles, exit codes for errors and interrupts, the
progress bar, and writing its output file (docs/commands.md)."""

from __future__ import annotations

import errno
import os
import stat
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from heterps_cli import __version__
from heterps_cli.cli.terminal import err, out, silence_stdout, stderr_is_a_terminal, write_stdout
from heterps_cli.errors import (
    EXIT_BAD_INPUT,
    EXIT_INFEASIBLE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_WORKER_LOST,
    InfeasibleError,
    InputError,
    SearchGaveUp,
    WorkerLost,
)
from heterps_cli.untrusted import printable

__all__ = ["err", "out"]


DEBUG = {"on": False}  # set by the root callback, which every command runs first
INTERRUPT_REPORTED = {"done": False}  # cli.entry.main says "interrupted" only when no command did


def print_error(prefix: str, lines: list[str]) -> None:
    for line in lines:  # a message may quote what a file held (an unknown key): never raw
        err.print(Text(prefix, style="bold red") + Text(printable(line)))


@contextmanager
def exit_codes():
    """Turn the library's errors into one-paragraph messages and exit codes of docs/spec.md section 5."""
    try:
        if sys.stdout is None:  # `>&-`: whatever the command wrote would be lost without a word
            raise InputError(
                None,
                None,
                "stdout",
                "standard output is closed, and heterps writes its result there: redirect it (> FILE, or "
                "> /dev/null to keep only --out) instead of closing it",
            )
        yield
        sys.stdout.flush()  # a full disk or a closed pipe fails here, while it can still be said
    except InputError as exc:
        print_error("error: ", exc.lines())
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except WorkerLost as exc:
        print_error("run stopped: ", [str(exc)])
        raise typer.Exit(EXIT_WORKER_LOST) from None
    except SearchGaveUp as exc:  # before InfeasibleError, its base: no proof, so not exit 3
        print_error("no plan found: ", [str(exc)])
        raise typer.Exit(EXIT_NOT_FOUND) from None
    except InfeasibleError as exc:
        print_error("infeasible: ", [str(exc)])
        raise typer.Exit(EXIT_INFEASIBLE) from None
    except KeyboardInterrupt:
        report_interrupt("")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except typer.Exit:
        raise
    except RecursionError as exc:  # where no caller named the user's code: a model that calls itself, say
        print_error(
            "error: ",
            [
                f"the work recursed deeper than Python allows ({exc}): a model whose forward calls itself "
                "without end, or an input nested that deep"
            ],
        )
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except Exception as exc:  # a bug: one line and its own exit code, the traceback on request
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:  # the reader left (| head): as rich's output
            silence_stdout()
            return
        if isinstance(exc, OSError) and exc.errno in STDOUT_ERRNOS:
            print_error("error: ", [_write_failure(exc)])
            raise typer.Exit(EXIT_BAD_INPUT) from None
        if DEBUG["on"]:
            raise
        print_error(
            "internal error: ",
            [
                f"{type(exc).__name__}: {exc} (heterps {__version__}; please report it with "
                "the command that caused it; --debug or HETERPS_DEBUG=1 shows the traceback)"
            ],
        )
        raise typer.Exit(EXIT_INTERNAL) from None


# Write failures: files are read through yamlio and written through outfiles, which turn every OSError
# into an InputError naming the file, so one that reaches here is standard output's, unless it says
# whose it is or standard output still takes a write.
STDOUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _write_failure(exc: OSError) -> str:
    """What failed to be written: the file the error names, else standard output, unless its file system
    has room left where the error says there is none (then a write heterps cannot name)."""
    why = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"cannot write {printable(str(exc.filename))} ({why})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and _has_room(sys.stdout):
        return f"a write failed ({why}), not to standard output, which has room: free space where heterps writes"
    silence_stdout()
    return f"cannot write standard output ({why}): what heterps printed there is incomplete"


def _has_room(stream) -> bool:
    """Whether ``stream`` is a file on a file system with blocks free (a device, as /dev/full, or a pipe
    cannot say: then it is the one that failed)."""
    try:
        fd = stream.fileno()
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.fstatvfs(fd).f_bavail > 0
    except (OSError, ValueError, AttributeError):  # closed, or no file behind it
        return False


def users_prints_to_stderr():
    """Around the user's model code (its module, factory and forward): what it prints goes to stderr,
    since stdout carries heterps's result (a profile with --out -, run's JSON)."""
    return redirect_stdout(sys.stderr)


@contextmanager
def progress_bar():
    """A transient progress bar on stderr; yields the callback schedulers report to."""
    columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TimeElapsedColumn())
    # Not drawn when stderr is a file or a pipe: a log would keep only a stray blank line of it.
    with Progress(*columns, console=err, transient=True, disable=not stderr_is_a_terminal()) as bar:
        task = bar.add_task("starting…", total=None)

        def report(description: str, completed: float | None = None, total: float | None = None) -> None:
            bar.update(task, description=description, completed=completed, total=total)

        yield report


@contextmanager
def progress_or_lines(prefix: str):
    """A progress bar on a terminal; elsewhere (a log file, a pipe, a job's output) each message as a
    line of its own, ``prefix`` before it, for a long run whose log would otherwise say nothing."""
    if stderr_is_a_terminal():
        with progress_bar() as report:
            yield report
        return

    def said(description: str, completed: float | None = None, total: float | None = None) -> None:
        sys.stderr.write(printable(f"{prefix}: {description}") + "\n")
        sys.stderr.flush()

    yield said


def not_an_input(out_file: str | Path | None, *inputs: Path | str | None, field: str = "--out") -> None:
    """Refuse, before the command's work, an output it could not write after it (a folder, a FIFO, a
    name too long, a folder it cannot write in: :func:`~heterps_cli.outfiles.check_writable`), or one
    that names one of the command's own input files (``plan p.yaml c.yaml --out p.yaml`` replaced the
    profile with a plan)."""
    from heterps_cli.outfiles import check_writable

    if out_file is None or str(out_file) == "-":
        return
    for given in inputs:
        try:
            same = given is not None and os.path.samefile(out_file, given)
        except (OSError, ValueError):  # either is missing or unreadable: not the same file
            same = False
        if same:
            raise InputError(
                str(out_file), None, field, f"is {given}, an input of this command: write the result elsewhere"
            )
    check_writable(out_file, field)


def not_a_folder_for_files(directory: str | Path | None, field: str = "--out") -> None:
    """Refuse, before the command's work, a folder it could not write its set of files into."""
    from heterps_cli.outfiles import check_set_folder

    if directory is not None:
        check_set_folder(directory, field)


def write_output(path: str, data: str | bytes) -> None:
    """``--out FILE`` atomically, or ``--out -`` to standard output."""
    from heterps_cli.outfiles import write_atomic

    if path == "-":
        write_stdout(data)
        return
    write_atomic(path, data)


def say_interrupted(what: str) -> None:
    """After the output of a run that Ctrl-C cut short: say so, and exit 130 so scripts see it."""
    report_interrupt(what)
    raise typer.Exit(EXIT_INTERRUPTED)


def report_interrupt(what: str) -> None:
    """'interrupted' (with what it means for the output, when there is some); cli.entry.main then
    adds nothing of its own."""
    INTERRUPT_REPORTED["done"] = True
    print_error("interrupted: " if what else "interrupted", [what])
