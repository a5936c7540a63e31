"""YAML in and out: safe loading that remembers the line of every field, atomic writes.

Validation errors must name the line of the offending field, and PyYAML's
``safe_load`` forgets positions. So we compose the node graph with the safe
loader ourselves, record ``path -> line`` while walking it, and construct the
Python data from that same graph (one parse, no unsafe tags).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from heterps_cli.errors import InputError

FieldPath = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats such as ``4.2e9`` and ``1e-3``.

    PyYAML follows YAML 1.1, where ``4.2e9`` (no sign after the ``e``) is a
    *string*; profiles are full of byte counts written that way.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def format_path(path: FieldPath) -> str:
    """('layers', 3, 'times', 'v100', 'oct') -> 'layers[3].times.v100.oct'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class Document:
    """A loaded YAML file: its data and the line where each field path starts."""

    def __init__(self, path: str, data: Any, lines: dict[FieldPath, int]):
        self.path, self.data, self._lines = path, data, lines

    def line(self, field: FieldPath) -> int:
        """Line of ``field``, or of its nearest ancestor that exists (e.g. for a missing key)."""
        field = tuple(field)
        while field not in self._lines and field:
            field = field[:-1]
        return self._lines.get(field, 1)

    def error(self, field: FieldPath, message: str) -> InputError:
        return InputError(self.path, self.line(field), format_path(field) or None, message)


def _walk(node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int], doc_path: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                # PyYAML silently keeps the last duplicate; a typo must not change a plan.
                raise InputError(
                    doc_path, line, format_path(path + (key,)),
                    f"duplicate key (first given on line {seen[key]})",
                )
            seen[key] = line
            lines[path + (key,)] = line
            _walk(value_node, path + (key,), lines, doc_path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), lines, doc_path)


def load_yaml(path: str | os.PathLike) -> Document:
    """Read a YAML file into a :class:`Document`; any problem is an :class:`InputError`."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(shown, None, None, "file not found") from None
    except IsADirectoryError:
        raise InputError(shown, None, None, "is a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise InputError(shown, None, None, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise InputError(shown, None, None, f"cannot read: {exc.strerror}") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError(shown, 1, None, "file is empty: expected a YAML mapping")
        lines: dict[FieldPath, int] = {}
        _walk(node, (), lines, shown)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(shown, line, None, f"not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(shown, None, None, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise InputError(shown, 1, None, f"expected a YAML mapping at the top, found {type(data).__name__}")
    return Document(shown, data, lines)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` so that readers see the old file or the new one, never half of it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InputError(str(path), None, None, f"cannot write here: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(str(path), None, None, f"cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True)
