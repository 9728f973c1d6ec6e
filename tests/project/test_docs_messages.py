"""Every `Error: ...`, `Warning: ...` and `Note: ...` line README.md and docs/ quote is worded as
torchkit's source words it: a message reworded in the code cannot stay quoted in its old words,
and a quote with a word dropped, changed or added is found.

A grep-level check, nothing is run. The source's string expressions are templates: each string
literal, f-string and `+` of them (what `+=` adds to a name: with a field before it), cut at its
fields (an f-string's `{...}`, a `%s`, a `str.format` `{}`); where a function gives a name a
string expression once (`read_as = ("an " if ...) + kind`), a field of it holds that
expression's parts. Spaces aside, a quote must be laid out of them: a template whose pieces all
stand in the quote whole and in order, each field between them holding a value, or a template
laid out in turn, or such things joined by a separator the source joins with (`", ".join`).
Side by side fields (`{name}{more}`) hold one thing with words at most, the others values or an
affix a field chooses (`{'s' if n > 1 else ''}`); a field set off by spaces holds something (one
glued to a word, `with{where}`, may hold nothing). Values: the docs' placeholders (`<what>`,
`PATH`, `...`), names with a digit, `/`, `.`, `_` or `~` in them (`raw2/`, `run/notes.txt`),
numbers, quoted reprs (`'cat'`), a command line's words after `torchkit` in backticks, the
example names the docs fill messages with, and texts other programs word (an OS error's `No
space left on device`). A quote's `...` stands for a field's value, for the rest of a template
from within a piece, for part of it up to a later piece's end, or for a template's start.

Not found: a value left out or swapped for another, a word next to the quote's own `...`, and
a word of a field that may hold any message (`{what}` holds `run folder` and `folder` alike);
small templates of many fields (`f"{a} {b} is {c}"`) lay out a few reworded quotes too."""

from __future__ import annotations

import ast
import functools
import re
import sys

import pytest
from suite_paths import REPO

DOCS = REPO / "docs"
# Example values the docs fill quoted messages with (folder, file, split and encoding names).
EXAMPLE_NAMES = {"rose", "flowers", "backup", "run", "report", "raw", "val", "ascii", "o"}
# Texts other programs word, which a message holds as a value (an OSError's, an HTTP status's).
OUTSIDE_TEXTS = ("No space left on device", "Not Found")
# A replacement field: an f-string's or `str.format`'s `{...}`, or a %-conversion.
_FIELD = re.compile(r"\{[^{}]*\}|%[-+ #0]*\d*(?:\.\d+)?[sdrfgx]")
_QUOTED_SPAN = re.compile(r"`((?:Error|Warning|Note): [^`]+)`")
ELLIPSIS = "..."
# A value: a placeholder, a quoted repr, or a name (a path, a number, an identifier).
_VALUE = re.compile(r"<[^<>]*>|\.\.\.|'[^'\s]*'|[\w~{}+/.:-]*[\w}/]")


def _bare(text: str) -> str:
    return re.sub(r"\s+", "", text)


Template = tuple[tuple[str, ...], tuple[tuple[int, bool], ...]]


def _template(parts: list[str | None]) -> Template:
    """Pieces (spaces dropped) with a field between each two, and for each field how many
    fields side by side it is and whether it may be empty (one glued to a word, as `with{where}`
    is, brings its own space, and may bring nothing): `{a} holds {b}{c}` -> (('', 'holds', ''),
    ((1, False), (2, False)))."""
    raw = [""]
    for part in parts:
        if part is None:
            raw.append("")
        else:
            split = _FIELD.split(part)
            raw[-1] += split[0]
            raw += split[1:]
    pieces, fields = [raw[0]], []
    for piece in raw[1:]:
        if len(pieces) > 1 and not pieces[-1].strip():
            pieces[-1] = piece
            fields[-1] += 1
        else:
            pieces.append(piece)
            fields.append(1)
    optional = [
        bool(re.search(r"\w$", before) or re.match(r"\w", after))
        for before, after in zip(pieces, pieces[1:], strict=False)
    ]
    return tuple(_bare(piece) for piece in pieces), tuple(zip(fields, optional, strict=True))


def _parts(node: ast.AST) -> list[str | None] | None:
    """A string expression as literal texts and fields (None): an f-string, a `+` of strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        parts: list[str | None] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(value.value)
            elif isinstance(value.value, ast.Name) and value.value.id in _NAMED:
                parts += _parts(_NAMED[value.value.id]) or [None]  # `{read_as}`: its parts
            else:
                parts.append(None)
        return parts
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if not (_stringy(node.left) or _stringy(node.right)):
            return None
        return (_parts(node.left) or [None]) + (_parts(node.right) or [None])
    return None


# The names a function gives a string expression once, and no other value
# (`read_as = ("an " if ...) + kind`), whose fields then hold its parts: set while it is read.
_NAMED: dict[str, ast.AST] = {}


def _named(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.AST]:
    stores: dict[str, int] = {}
    assigned: list[ast.Assign] = []  # one walk of the body: it is the test's largest cost
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            stores[node.arg] = stores.get(node.arg, 0) + 2
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            assigned.append(node)
    return {
        node.targets[0].id: node.value
        for node in assigned
        if stores[node.targets[0].id] == 1 and _parts(node.value) is not None
    }


def _stringy(node: ast.AST) -> bool:
    """A string expression, or a choice of strings (`"an " if ... else "a "`)."""
    if isinstance(node, ast.IfExp):
        return _stringy(node.body) or _stringy(node.orelse)
    return _parts(node) is not None


class Source:
    """torchkit's message templates (each string literal, f-string and `+` of them, cut at its
    fields) and the separators its `.join` calls put between values."""

    def __init__(self) -> None:
        self.templates: set[Template] = set()
        self.separators: set[str] = set()
        # The affixes a field chooses between (`'s' if n > 1 else ''`, `"an " if ... else "a "`).
        self.choices: set[str] = set()
        for path in sorted((REPO / "torchkit").rglob("*.py")):
            self._collect(ast.parse(path.read_text(encoding="utf-8")))

    def _collect(self, node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            outer = dict(_NAMED)
            _NAMED.clear()
            _NAMED.update(_named(node))
            for child in ast.iter_child_nodes(node):
                self._collect(child)
            _NAMED.clear()
            _NAMED.update(outer)
            return
        parts = _parts(node)
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.op, ast.Add)
            and (added := _parts(node.value)) is not None  # `line += f"; {...}"`
            and any((template := _template([None, *added]))[0])
        ):
            self.templates.add(template)
        if parts is not None and any((template := _template(parts))[0]):
            self.templates.add(template)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join"
            and isinstance(node.func.value, ast.Constant)
            and isinstance(node.func.value.value, str)
            and (separator := _bare(node.func.value.value))
        ):
            self.separators.add(separator)
        for child in _fields(node) if parts is not None else ast.iter_child_nodes(node):
            if isinstance(child, ast.IfExp):  # an affix: a plural's `s`, an article, a `/`
                self.choices.update(
                    _bare(branch.value)
                    for branch in (child.body, child.orelse)
                    if isinstance(branch, ast.Constant)
                    and isinstance(branch.value, str)
                    and not re.search(r"[^\W\d_]{3}", branch.value)
                )
            self._collect(child)


def _fields(node: ast.AST) -> list[ast.AST]:
    """The expressions of a string expression's fields (`f"{'s' if n > 1 else ''}"`)."""
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
    if isinstance(node, ast.BinOp):
        return [
            part
            for side in (node.left, node.right)
            for part in (_fields(side) if _parts(side) is not None else [side])
        ]
    return []


def _value_spans(body: str) -> set[tuple[int, int]]:
    """The values of a quote, as spans of its text without spaces: placeholders (`<what>`,
    `PATH`, `...`), names with a digit, `/`, `.`, `_` or `~` (`raw2/`, `run/notes.txt`), numbers
    (`48` of `48x48`), quoted reprs (`'cat'`), example names and texts other programs word."""
    bare_at = [0]
    for char in body:
        bare_at.append(bare_at[-1] + (not char.isspace()))
    spans = {(bare_at[m.start()], bare_at[m.end()]) for m in re.finditer(r"\d+(?:\.\d+)?", body)}
    for start in range(len(body)):
        if body[start].isspace() or (start and body[start - 1].isalnum()):
            continue
        ends = [start + len(text) for text in OUTSIDE_TEXTS if body.startswith(text, start)]
        if word := re.match(r"[A-Z][A-Z_0-9]*\b", body[start:]):  # `IMAGES` of `IMAGES:`
            ends.append(start + word.end())
        if match := _VALUE.match(body, start):
            token = match.group(0)
            if (
                token[0] in "<'."
                or re.search(r"[\d/._~]", token)
                or re.fullmatch(r"[A-Z][A-Z_0-9]*", token)
                or token in EXAMPLE_NAMES
            ):
                ends.append(match.end())
        spans.update((bare_at[start], bare_at[end]) for end in ends)
    for line in re.finditer(r"(?<=`)torchkit [^`]*", body):  # a command line's words
        ends = [m.end() for m in re.finditer(r"\S(?= |$)", line.group(0))]
        spans.update((bare_at[line.start()], bare_at[line.start() + end]) for end in ends)
    return spans


def _memo(method):
    """functools.cache that answers False to a call made again while it is being answered: a
    field whose value would be the whole text it is part of adds nothing."""

    def cached(self, *args):
        key = (method.__name__, *args)
        if key not in self.answers:
            self.answers[key] = False
            self.answers[key] = method(self, *args)
        return self.answers[key]

    return cached


class _Laid:
    """A template as one quote lays it out (hashed by identity: looked up often)."""

    __slots__ = ("pieces", "fields")

    def __init__(self, pieces: tuple[str, ...], fields: tuple[tuple[int, bool], ...]) -> None:
        self.pieces, self.fields = pieces, fields


class _Quote:
    """One quote's layout: whether its text (spaces dropped) is a value, a template with its
    fields filled, or such things joined by a separator, all the way down; a `...` of the quote
    stands for a field's value, or for the rest (or the start) of a template."""

    def __init__(self, body: str, source: Source) -> None:
        self.answers: dict[tuple, bool] = {}
        self.text = text = _bare(body)
        self.values = _value_spans(body)
        # Where a field's value may begin or end: not within a word, but before a plural's end.
        self.cuts = {
            len(_bare(body[:at]))
            for at in range(len(body) + 1)
            if not (0 < at < len(body) and body[at - 1].isalpha() and body[at].isalpha())
            or re.match(r"e?s\b", body[at:])
        }
        self.separators = [s for s in source.separators if s in text]
        self.choices = source.choices
        self.ellipses = [m.start() for m in re.finditer(re.escape(ELLIPSIS), text)]
        # What a `...` may cut a piece to: from a word's start up to it, or from it on.
        self.before_ellipses = tuple(
            text[at:end] for end in self.ellipses for at in self.cuts if at < end
        )
        self.after_ellipses = tuple(
            text[end + 3 : at] for end in self.ellipses for at in self.cuts if at > end + 3
        )
        self.templates = [_Laid(*t) for t in source.templates if self._may_lay(t)]
        # Where each template may begin: at its first piece, or anywhere for a field first.
        self.starting: dict[int, list[_Laid]] = {}
        self.field_first = []
        for template in self.templates:
            first = template.pieces[0]
            if not first:
                self.field_first.append(template)
                continue
            places = {m.start() for m in re.finditer(f"(?={re.escape(first)})", text)}
            for at in self.ellipses:  # its start and a `...` for the rest
                places.update(
                    at - size
                    for size in range(min(at, len(first)) + 1)
                    if text[at - size : at] == first[:size]
                )
            for at in places:
                self.starting.setdefault(at, []).append(template)

    def _may_lay(self, template: Template) -> bool:
        """Whether the quote holds the template's pieces: all of them, or those up to one that a
        `...` cuts (its start before one, its end after one) or leaves out."""
        pieces = [piece for piece in template[0] if piece]
        missing = next((i for i, piece in enumerate(pieces) if piece not in self.text), None)
        if missing is None:
            return True
        return bool(self.ellipses) and (
            missing > 0
            or pieces[0].startswith(self.before_ellipses)
            or pieces[0].endswith(self.after_ellipses)
        )

    @_memo
    def fill(self, start: int, end: int) -> bool:
        """Whether text[start:end] is what a field can hold: nothing, or units (values and
        templates) with separators between them, or values side by side."""
        if start not in self.cuts or end not in self.cuts:
            return False
        return start == end or self.units(start, end)

    @_memo
    def units(self, start: int, end: int) -> bool:
        if self.unit(start, end):
            return True
        for first_end in range(start + 1, end):
            if (start, first_end) in self.values and self.units(first_end, end):
                return True
        for separator in self.separators:
            at = self.text.find(separator, start + 1, end)
            while at != -1:
                after = at + len(separator)
                if after < end and self.unit(start, at) and self.units(after, end):
                    return True
                at = self.text.find(separator, at + 1, end)
        return False

    @_memo
    def unit(self, start: int, end: int) -> bool:
        if (start, end) in self.values:
            return True
        cut = ELLIPSIS in self.text[start:end]
        for template in self.starting.get(start, []) + self.field_first:
            last = template.pieces[-1]
            if last and not cut and not self.text.endswith(last, start, end):
                continue
            if not cut and any(
                self.text.find(piece, start, end) == -1 for piece in template.pieces if piece
            ):
                continue
            if self.laid(template, 0, start, end):
                return True
        return self.text.startswith(ELLIPSIS, start) and self.tail(start + 3, end)

    @_memo
    def tail(self, start: int, end: int) -> bool:
        """Whether text[start:end] is the end of a template, from within one of its pieces."""
        for template in self.templates:
            for index, piece in enumerate(template.pieces):
                for size in range(1, len(piece) + 1):
                    if not self.text.startswith(piece[-size:], start):
                        break
                    if self.after(template, index, start + size, end):
                        return True
        return False

    @_memo
    def laid(self, template: _Laid, index: int, start: int, end: int) -> bool:
        """Whether text[start:end] is the template from its piece `index` on: the piece, then
        a field, and so on; or the start of the piece and a `...` for the rest of the message."""
        piece = template.pieces[index]
        for cut in self.ellipses:  # the piece's start, then the `...`
            if (
                (start < cut or index)
                and cut <= end - 3
                and piece.startswith(self.text[start:cut])
                and self.resumed(template, index, cut + 3, end)
            ):
                return True
        if not self.text.startswith(piece, start) or start + len(piece) > end:
            return False
        return self.after(template, index, start + len(piece), end)

    @_memo
    def resumed(self, template: _Laid, index: int, start: int, end: int) -> bool:
        """Whether text[start:end], after a `...` that cut the template's piece `index`, is the
        rest of the template from within one of its later pieces (or nothing)."""
        pieces = template.pieces
        for later in range(index, len(pieces)):
            piece = pieces[later]
            for size in range(len(piece) + 1):
                if size and not self.text.startswith(piece[-size:], start):
                    continue
                if self.after(template, later, start + size, end):
                    return True
        return False

    @_memo
    def after(self, template: _Laid, index: int, start: int, end: int) -> bool:
        """Whether text[start:end] is what follows the template's piece `index`: nothing after
        its last piece, else its field's value (values, side by side fields) and the rest."""
        pieces, fields = template.pieces, template.fields
        if index == len(pieces) - 1:
            return start == end
        following = pieces[index + 1]
        if index + 1 == len(pieces) - 1 and not following:
            return self.fills(start, end, *fields[index])
        places = [
            m.start() + start
            for m in re.finditer(f"(?={re.escape(following)})", self.text[start:end])
        ]
        for cut in self.ellipses:  # the piece cut by a `...`
            places += [
                at
                for at in range(max(start, cut - len(following)), cut + 1)
                if cut + 3 <= end and following.startswith(self.text[at:cut])
            ]
        return any(
            self.laid(template, index + 1, at, end) and self.fills(start, at, *fields[index])
            for at in places
        )

    @_memo
    def fills(self, start: int, end: int, count: int, optional: bool, worded: bool = True) -> bool:
        """Whether text[start:end] is the values of `count` fields side by side, of which one
        at most (none where not `worded`) holds words: the others values, a choice's string
        (`'s'` of `{'s' if n > 1 else ''}`) or nothing; nothing in all only where `optional`."""
        if start == end and not optional:
            return False
        if count == 1:
            return self.fill(start, end) if worded else self.bare_value(start, end)
        return any(
            (self.bare_value(start, at) and self.fills(at, end, count - 1, True, worded))
            or (worded and self.fill(start, at) and self.fills(at, end, count - 1, True, False))
            for at in range(start, end + 1)
            if at in self.cuts
        )

    @_memo
    def bare_value(self, start: int, end: int) -> bool:
        """Whether text[start:end] is nothing, values side by side, or a choice's string."""
        if start == end or (start, end) in self.values or self.text[start:end] in self.choices:
            return True
        return any(
            (start, at) in self.values and self.bare_value(at, end) for at in range(start + 1, end)
        )


def _explained(message: str, source: Source) -> bool:
    """Whether a quoted message is one torchkit's templates can make: `<what> (<hint>)` alike.
    The layout recurses a step per piece and field: deeper than Python's default limit."""
    body = re.sub(r"^(Error|Warning|Note): ", "", message)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return _Quote(body, source).fill(0, len(_bare(body)))
    finally:
        sys.setrecursionlimit(limit)


@functools.cache
def _source() -> Source:
    return Source()


def _quoted_messages() -> list[tuple[str, str]]:
    """(document, message) for each message quoted in a code span or as a code block's line."""
    found = []
    for document in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = document.read_text(encoding="utf-8")
        quotes = _QUOTED_SPAN.findall(text)
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
            lines = block.splitlines()
            quotes += [line for line in lines if re.match(r"(Error|Warning|Note): ", line)]
        name = document.relative_to(REPO).as_posix()
        found += [(name, " ".join(quote.split())) for quote in quotes]
    return found


def test_every_quoted_message_is_worded_as_the_source_words_it():
    messages = _quoted_messages()
    assert len(messages) >= 30, messages  # the docs are read: a changed quoting drops none
    source = _source()
    drifted = [
        f"{document}: {message!r}"
        for document, message in messages
        if not _explained(message, source)
    ]
    assert not drifted, "not laid out of the source's templates:\n" + "\n".join(drifted)


@pytest.mark.parametrize(
    "message",
    [
        # a word dropped: `not`, `be`
        "Error: run folder run holds run/notes.txt that torchkit did write, which --force would "
        "delete with it (move them out of run, or delete them yourself)",
        "Error: none of the N images in IMAGES could read",
        # a word changed: `used` -> `taken`, `did` -> `can`, `in` -> `on`
        "Warning: --lr is given twice (1, then 2): the last, 2, is taken",
        "Error: output folder report holds report/my_plot.png that torchkit can not write, ...",
        "Error: i.csv gives './a.png' two labels: 'cat' in line 2 and 'dog' on line 9",
        # a word added, a message the source never had
        "Error: cannot write PATH: ...; the finished run is kept safely in RUN",
        "Error: the model weights could not be downloaded from the internet",
    ],
)
def test_a_reworded_quote_is_found(message):
    """The check can fail: a word dropped, changed or added, a message the source never had."""
    assert not _explained(message, _source())


@pytest.mark.parametrize(
    "message",
    [
        "Warning: --lr is given twice (1, then 2): the last, 2, is used",
        # other values in the fields, the hint cut with `...`
        "Error: ROOT given twice: x/ and --data y/ (give one of them)",
        "Error: i.csv gives './b.png' two labels: 'cat' in line 12 and 'dog' in line 90",
        "Error: none of the 5 images in photos/ could be read",
        "Error: ROOT given twice: x/ and --data y/ (give ...)",
    ],
)
def test_the_quotes_as_the_source_words_them_pass(message):
    assert _explained(message, _source())
