"""heterps: plan DNN training on heterogeneous, priced resources."""

__version__ = "0.1.0"


def main() -> None:
    """The ``heterps`` console script.

    It imports the CLI itself, so that Ctrl-C at any moment (even while the
    libraries load) ends with one line and exit 130, and SIGTERM with exit 143;
    both unwind normally, so no half-written file is left behind.
    """
    import signal
    import sys

    def terminate(signum, frame):
        sys.stderr.write("terminated\n")
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, terminate)
    try:
        from heterps_cli.cli import app

        app(prog_name="heterps")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
