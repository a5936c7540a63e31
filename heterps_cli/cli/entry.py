"""The ``heterps`` console script: the command line, with Ctrl-C and SIGTERM turned into exit codes
(docs/commands.md). Its imports wait for ``main`` so that an interrupt while libraries load is
caught too."""

from __future__ import annotations


def main() -> None:
    """The ``heterps`` console script.

    It imports the CLI itself, so that Ctrl-C at any moment (even while the
    libraries load) ends with one line and exit 130, and SIGTERM with exit 143;
    both unwind normally, so no half-written file is left behind.
    """
    import signal
    import sys

    from heterps_cli.errors import EXIT_INTERRUPTED, Terminated  # no import of a library before the handlers

    def terminate(signum, frame):
        sys.stderr.write("terminated\n")
        raise Terminated()

    # CPython swallows a KeyboardInterrupt raised inside some of its own callbacks (an import's module
    # lock), and the command then runs on; Ctrl-C is remembered, so it still ends in exit 130.
    ctrl_c = {"seen": False}

    def interrupt(signum, frame):
        ctrl_c["seen"] = True
        raise KeyboardInterrupt

    def unraisable(info, default=sys.unraisablehook):
        if not isinstance(info.exc_value, KeyboardInterrupt):  # that one said once, as "interrupted"
            default(info)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, interrupt)
    sys.unraisablehook = unraisable
    try:
        from heterps_cli.cli import terminal  # rich: a Ctrl-C while it loads is caught below

        terminal.install()
        _refuse_bytes_that_are_not_utf8(sys.argv[1:])
        from heterps_cli.cli.app import app

        app(prog_name="heterps")
    except KeyboardInterrupt:
        _exit_interrupted(said=False)
    except SystemExit as exc:
        if exc.code != EXIT_INTERRUPTED and not ctrl_c["seen"]:
            raise
        # typer exits 130 without a word when Ctrl-C lands in its own start-up (it imports pydantic
        # then); a command that was interrupted has already said so.
        cli = sys.modules.get("heterps_cli.cli.session")
        _exit_interrupted(said=cli is not None and cli.INTERRUPT_REPORTED["done"])
    except Exception as exc:
        # Ctrl-C inside a class body being created (while a library loads) reaches us wrapped in a
        # RuntimeError; it is still Ctrl-C.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        _exit_interrupted(said=False)


def _exit_interrupted(said: bool) -> None:
    """Say "interrupted" unless a command already did, and exit 130 now. Files and child processes
    were already cleaned up as the interrupt unwound (finally blocks); left to itself, CPython may
    instead kill itself with SIGINT at exit when a KeyboardInterrupt passed through some of its own
    frames, which callers see as -2, not 130."""
    import os
    import sys

    from heterps_cli.errors import EXIT_INTERRUPTED

    if not said:
        sys.stderr.write("interrupted\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def _refuse_bytes_that_are_not_utf8(args: list[str]) -> None:
    """Exit 2 on an argument that is not UTF-8 (a file name in another encoding): Python keeps its bytes as
    lone surrogates, which no file heterps writes, no message and no process it starts can carry."""
    import sys

    from heterps_cli.errors import EXIT_BAD_INPUT

    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            option = args[i - 1] if i and args[i - 1].startswith("-") else f"argument {i + 1}"
            if arg.startswith("--") and "=" in arg:
                option = arg.partition("=")[0]
            shown = arg.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            sys.stderr.write(
                f"error: {option}: '{shown}' is not UTF-8 text: heterps takes names and paths as UTF-8 "
                "(rename the file, or give another path)\n"
            )
            sys.exit(EXIT_BAD_INPUT)
