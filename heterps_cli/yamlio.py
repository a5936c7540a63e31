"""YAML in and out: safe loading that remembers the line of every field, and dumping (files are
written by :mod:`heterps_cli.outfiles`).

Validation errors must name the line of the offending field, and PyYAML's
``safe_load`` forgets positions. So we compose the node graph with the safe
loader ourselves, record ``path -> line`` while walking it, and construct the
Python data from that same graph (one parse, no unsafe tags).

Input files may be hostile, so the loader refuses before it works hard: files
over :data:`MAX_BYTES`, nesting deeper than :data:`MAX_DEPTH`, an alias that
contains itself, and aliases that expand past :data:`MAX_ALIAS_NODES` nodes
(the "billion laughs" file). Scalars are read by the YAML 1.2 core schema, so
``0100`` is one hundred and ``yes`` is a string, never a silently different value.
"""

from __future__ import annotations

import gc
import os
import re
import select
import stat
import unicodedata
from typing import Any

import yaml
import yaml.cyaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from heterps_cli.errors import InputError

FieldPath = tuple[str | int, ...]

MAX_BYTES = 64 << 20  # a 10,000-layer profile is a few MB
MAX_DEPTH = 64  # profiles nest 5 deep; this only stops a hostile file before Python's recursion limit does
MAX_ALIAS_NODES = 100_000  # lists and mappings that aliases may add by repetition
FIFO_WAIT = 10  # seconds a named pipe may stay silent before reading it is given up
MAX_DIGITS = 4300  # digits of a whole number Python converts (sys.get_int_max_str_digits); the bounds say the rest


class _Scalars(SafeConstructor):
    """The YAML 1.2 core schema's scalars for both loaders below.

    PyYAML follows YAML 1.1: ``4.2e9`` (no sign after the ``e``) is a string,
    ``0100`` is octal 64, ``1:04`` is sexagesimal 64 and ``yes`` is true.
    Profiles are full of byte counts written the 1.2 way, and a number that
    silently means another number would change a plan.
    """

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = node.value.replace("_", "")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if len(digits) > MAX_DIGITS:  # int() refuses past 4,300 digits
            raise _not_a_number(node, f"a whole number of {len(digits):,} digits is no figure heterps can use")
        if digits[:2] in ("0o", "0x"):
            return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
        return sign * int(digits, 10)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        text = node.value.lower()
        if text.lstrip("+-") == ".inf":
            return float("-inf") if text.startswith("-") else float("inf")
        if text == ".nan":
            return float("nan")
        try:
            return float(text)
        except ValueError:  # the resolver lets underscores through (1_.5); Python's float() does not
            problem = f"{node.value!r} is not a number (write digits, a point and an exponent)"
            raise _not_a_number(node, problem) from None


def _not_a_number(node: yaml.ScalarNode, problem: str) -> yaml.MarkedYAMLError:
    return yaml.constructor.ConstructorError(None, None, problem, node.start_mark)


class _Loader(yaml.SafeLoader, _Scalars):
    """The pure-Python loader, with a nesting limit (its composer recurses in Python)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"nesting too deep (more than {MAX_DEPTH} levels)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Refused(yaml.MarkedYAMLError):
    def __init__(self, mark, problem: str):
        super().__init__(problem=problem, problem_mark=mark)


_LOADERS: list[Any] = [_Loader]  # yaml loader classes (their class methods are untyped)
if getattr(yaml, "__with_libyaml__", False):  # libyaml parses 10-25x faster: a 10,000-layer profile in a second

    class _CLoader(yaml.cyaml.CParser, _Scalars, Resolver):
        def __init__(self, stream: str):
            yaml.cyaml.CParser.__init__(self, stream)
            _Scalars.__init__(self)
            Resolver.__init__(self)

    _LOADERS.insert(0, _CLoader)

_IMPLICIT = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
        r"|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
)
for _cls in _LOADERS:
    _cls.add_constructor("tag:yaml.org,2002:int", _Scalars.construct_yaml_int)
    _cls.add_constructor("tag:yaml.org,2002:float", _Scalars.construct_yaml_float)

# The YAML 1.2 core schema's implicit tags, resolved by the first character and one pattern, without
# PyYAML's general machinery (path resolvers, implicit resolvers registered per class), which took half
# of reading a profile of 1.8 million scalars: one call a scalar.
_BY_FIRST: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _tag, _pattern, _first in _IMPLICIT:
    for _char in _first:
        _BY_FIRST.setdefault(_char, []).append((_tag, re.compile(_pattern)))
_DEFAULT_TAGS = {
    yaml.ScalarNode: "tag:yaml.org,2002:str",
    yaml.SequenceNode: "tag:yaml.org,2002:seq",
    yaml.MappingNode: "tag:yaml.org,2002:map",
}


def _resolve(self, kind, value, implicit) -> str:
    if kind is yaml.ScalarNode and implicit[0]:
        for tag, pattern in _BY_FIRST.get(value[:1], ()):
            if pattern.match(value):
                return tag
    return _DEFAULT_TAGS[kind]


def _no_path(self, *args) -> None:
    """heterps's loaders have no path resolvers: nothing to track on the way down or up."""


for _cls in _LOADERS:
    _cls.resolve = _resolve
    _cls.descend_resolver = _no_path
    _cls.ascend_resolver = _no_path


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

    def __init__(self, path: str, data: Any, lines: dict[FieldPath, int], text: str = ""):
        self.path, self.data, self._lines = path, data, lines
        self.text = text  # as read, once: a pipe or FIFO cannot be read a second time

    def line(self, field: FieldPath) -> int:
        """Line of ``field``, or of its nearest ancestor that exists (e.g. for a missing key)."""
        field = tuple(field)
        while field not in self._lines and field:
            field = field[:-1]
        return self._lines.get(field, 1)

    def error(self, field: FieldPath, message: str) -> InputError:
        return InputError(self.path, self.line(field), format_path(field) or None, message)


def nfc(text: str) -> str:
    """Text as NFC: "é" typed as one code point or as "e" and a combining accent is one name (a
    file saved on macOS and one saved elsewhere name the same type)."""
    return unicodedata.normalize("NFC", text) if isinstance(text, str) and not text.isascii() else text


def compatible(text: str) -> str:
    """Text in Unicode's compatibility form (NFKC): "ｖ100" (full-width) and "v100" read as one name,
    which two names must not."""
    return unicodedata.normalize("NFKC", text) if isinstance(text, str) and not text.isascii() else text


_STR, _INT, _FLOAT, _NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "null"))
_MAP, _SEQ = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


class _Walk:
    """Builds the data of a composed document and records the line of every field path, refusing
    recursive aliases, alias bombs and duplicate keys, in one pass: PyYAML's constructor, a second pass
    over the same nodes, took as long as parsing. Plain scalars, mappings and lists are built here; any
    other tag (``!!binary``, ``!!set``, a tag that names a class) goes to ``loader``'s safe constructor,
    which builds or refuses it."""

    def __init__(self, doc_path: str, loader: Any = None):
        self.doc_path, self.loader = doc_path, loader
        self.lines: dict[FieldPath, int] = {}
        self.seen: set[int] = set()  # the lists and mappings built so far: only they expand through aliases
        self.repeated = 0  # lists and mappings built again through an alias
        self.open: set[int] = set()  # the nodes on the way down to this one
        self.failed_at: FieldPath | None = None  # the field of a scalar that could not be built

    def refuse(self, node: yaml.Node, path: FieldPath, message: str) -> InputError:
        return InputError(self.doc_path, node.start_mark.line + 1, format_path(path) or None, message)

    def __call__(self, node: yaml.Node, path: FieldPath) -> Any:
        if len(path) > MAX_DEPTH:
            raise self.refuse(node, (), f"refused: nesting too deep (more than {MAX_DEPTH} levels)")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.ScalarNode):
            node.value = nfc(node.value)
            try:
                return self.scalar(node)
            except yaml.MarkedYAMLError:
                self.failed_at = path
                raise
        if id(node) in self.open:
            raise self.refuse(node, path, "recursive alias: this node contains itself")
        if id(node) in self.seen:
            self.repeated += 1
            if self.repeated > MAX_ALIAS_NODES:
                raise self.refuse(
                    node,
                    path,
                    f"aliases expand to more than {MAX_ALIAS_NODES:,} nodes "
                    "(an alias bomb?): write the data out instead",
                )
        self.seen.add(id(node))
        self.open.add(id(node))
        if isinstance(node, yaml.MappingNode):
            built: Any = self.mapping(node, path)
        else:
            built = [self(item, path + (i,)) for i, item in enumerate(node.value)]
        self.open.discard(id(node))
        if node.tag not in (_MAP, _SEQ):  # checked above; built by the constructor, which knows the tag
            built = self.build(node)
        return built

    def scalar(self, node: yaml.ScalarNode) -> Any:
        tag = node.tag
        if tag == _STR:
            return node.value
        if tag == _FLOAT:
            return _Scalars.construct_yaml_float(self.loader, node)
        if tag == _INT:
            return _Scalars.construct_yaml_int(self.loader, node)
        if tag == _NULL:
            return None
        return self.build(node)

    def build(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.MappingNode, path: FieldPath) -> dict:
        out: dict[Any, Any] = {}
        first: dict[Any, int] = {}  # a key as written (NFC) -> its line
        built: dict[Any, int] = {}  # a key as built -> its line: 1 and 01, 1 and 1.0 are one key
        folded: dict[str, str] = {}  # a key in compatibility form (NFKC) -> the key given
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.refuse(key_node, path, "a key must be a plain name, not a list or a mapping")
            written, key = key_node.value, nfc(key_node.value)
            key_node.value = key
            alike = folded.setdefault(compatible(key), key)
            if alike != key:
                raise InputError(
                    self.doc_path,
                    line,
                    format_path(path + (key,)),
                    f"is {alike!r} (line {first[alike]}) written with other characters of the same meaning "
                    "(Unicode NFKC: a full-width letter, a ligature): give distinct names, or write them alike",
                )
            value = self.scalar(key_node)
            said = first.get(key, built.get(value))
            if said is not None:
                # PyYAML silently keeps the last duplicate; a typo must not change a plan.
                if written != key:
                    other = ", as the same letters composed differently: names compare in Unicode NFC"
                else:
                    other = "" if key in first else f", as the same {type(value).__name__}"  # 1 and 01
                where = format_path(path + (key,))
                raise InputError(self.doc_path, line, where, f"duplicate key (first given on line {said}{other})")
            first[key] = built[value] = line
            self.lines[path + (key,)] = line
            out[value] = self(value_node, path + (key,))
        return out


def _open(path: str | os.PathLike, shown: str):
    """The file for reading. A FIFO opens without waiting for a writer (open() would block until one
    came, forever if none does), then must have something to read within :data:`FIFO_WAIT` seconds."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            if not waiting.poll(FIFO_WAIT * 1000):
                raise InputError(
                    shown, None, None, f"a pipe with nothing written to it in {FIFO_WAIT} s: is anything writing it?"
                )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read(path: str | os.PathLike, shown: str) -> str:
    try:
        with _open(path, shown) as fh:
            if stat.S_ISREG(os.fstat(fh.fileno()).st_mode) and os.fstat(fh.fileno()).st_size > MAX_BYTES:
                raise InputError(
                    shown,
                    None,
                    None,
                    f"file is over {MAX_BYTES >> 20} MiB: not a profile, cluster or plan heterps would read",
                )
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(shown, None, None, "file not found") from None
    except IsADirectoryError:
        raise InputError(shown, None, None, "is a directory, not a YAML file") from None
    except OSError as exc:
        raise InputError(shown, None, None, f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(shown, None, None, f"more than {MAX_BYTES >> 20} MiB: not a file heterps would read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            shown,
            line,
            None,
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} ({exc.reason}); is this a binary file?",
        ) from None


def load_yaml(path: str | os.PathLike) -> Document:
    """Read a YAML file into a :class:`Document`; any problem is an :class:`InputError`."""
    shown = str(path)
    text = _read(path, shown)
    # Millions of nodes and no cycle among them: the collector's passes over them, ever longer, took
    # three quarters of reading a 20 MB profile (22 s; 5 s without). It comes back once the nodes are
    # gone (_parse has returned), so that its first pass has only the data to look at.
    collecting = gc.isenabled()
    gc.disable()
    try:
        data, lines = _parse(text, shown)
    finally:
        if collecting:
            gc.enable()
    if not isinstance(data, dict):
        raise InputError(shown, 1, None, f"expected a YAML mapping at the top, found {type(data).__name__}")
    return Document(shown, data, lines, text)


def _parse(text: str, shown: str) -> tuple[Any, dict[FieldPath, int]]:
    """The data of the YAML ``text`` and the line of every field path."""
    loader = None
    walk: _Walk | None = None
    try:
        loader = _LOADERS[0](text)  # the pure-Python reader checks for control characters here
        node = loader.get_single_node()
        if node is None:
            raise InputError(shown, 1, None, "file is empty: expected a YAML mapping")
        walk = _Walk(shown, loader)
        data = walk(node, ())
    except yaml.reader.ReaderError as exc:  # a control character, before any parsing
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise InputError(
            shown,
            line,
            None,
            f"control character U+{exc.character:04X} at column {column}: "
            "YAML text cannot hold it (is this a binary file?)",
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at: int | None = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        tab = at is not None and "\t" in (text.splitlines()[at - 1 : at] or [""])[0]
        if tab or "'\\t'" in problem or "tab character" in problem:
            problem += " (indent with spaces: YAML does not allow tabs there)"
        elif "constructor for the tag" in problem:
            problem += " (heterps reads plain data only: tags that build objects are refused)"
        what = "refused" if isinstance(exc, _Refused) else "not valid YAML"
        if "maximum nesting depth" in problem:  # PyYAML 6.0.4's own limit, met before ours: say it as ours
            what, problem = "refused", f"nesting too deep (more than {MAX_DEPTH} levels)"
        # A value the reader parsed but cannot build (a number no float holds) has a field by now.
        field = format_path(walk.failed_at) if walk and walk.failed_at else None
        raise InputError(shown, at, field, f"{what}: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(shown, None, None, f"not valid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, walk.lines


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True)
