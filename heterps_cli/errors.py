"""Errors the CLI turns into exit codes (SPEC section 5), never into tracebacks."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3


class InputError(Exception):
    """Bad input: a file, the line in it, the field path and what is wrong (exit 2)."""

    def __init__(self, path: str | None, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field, message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class InfeasibleError(Exception):
    """No plan meets the constraints (exit 3); the message states the best reachable figure."""
