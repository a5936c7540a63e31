"""The command line: thin commands over :mod:`heterps_cli.api` (app) and their rich rendering (render)."""
