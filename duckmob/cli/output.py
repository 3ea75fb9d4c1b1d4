"""How the shell prints a result: the modes ``.mode`` chooses, and ``-o`` files.

Results print in the mode ``.mode`` sets, as the DuckDB CLI prints them:

- ``duckbox`` (the default): an aligned box table with each column's type. At most ``.maxrows`` rows (100 by
  default): a longer result shows its first and its last ``maxrows / 2`` rows and its true row count (it is
  read once, as a stream of Arrow batches: memory holds the rows shown and one batch of :data:`BATCH_ROWS`, not
  the result). A table fits ``.maxwidth`` (default: the terminal's width; :data:`PIPE_WIDTH` when standard
  output is not a terminal): the widest columns are cut first, all to the same width; a cut cell of words (text
  with spaces, such as ``mob_check``'s actions) wraps onto up to :data:`WRAP_LINES` lines of its row at word
  boundaries, other text ends in ``…`` where it was cut (as does wrapped text longer than those lines); only when
  every column is down to :data:`MIN_COLUMN` characters are middle columns left out (a ``…`` column stands for
  them). DOUBLE and FLOAT values show about 4 significant digits (:func:`format_double`):
  a whole value as DuckDB writes it (2.0, 1968.0); otherwise from 1e-4 up to 1,000 as Python's ``{:.4g}``
  (0.02153, 12.35), from 1,000 up to 1e6 rounded to a whole number (1235), but a value that is not whole never
  prints as one: where those digits would round it to a whole number, it gets as many decimals as it takes to
  show its fraction (3.0003, not 3; 1234.6, not 1235; 999.96, not 1000). Below 1e-4 and from 1e6 on in
  scientific notation (2.1e-05, 1.235e+06); nan, inf and NULL as DuckDB writes them. Other types (DECIMAL,
  integers, timestamps, lists...) show as DuckDB casts them to text.
- ``csv``: a header line, then one line per row, quoted as CSV quotes (Python's ``csv`` module); NULL is empty.
- ``markdown``: a pipe table (numbers right-aligned); the whole result is held to size its columns.
- ``line``: one ``column = value`` line per column, names right-aligned, rows separated by a blank line.
- ``json``: a JSON array of objects, one per row, each value as DuckDB's ``to_json`` writes it.

All but duckbox print every row and every digit (``.maxrows`` and the 4 digits are for reading at a terminal).
The box table and the number format follow the DuckDB CLI's renderer (``duckbox``), so that a result reads the
same in both shells.
"""

from __future__ import annotations

import csv
import json
import math
import re
import unicodedata

import duckdb
import pyarrow as pa

from duckmob.errors import DuckmobError

# Rows per Arrow batch read from a result (DuckDB's vector size): the most a result holds beyond the rows shown.
BATCH_ROWS = 2048
# A table's width when standard output is not a terminal (as DuckDB's renderer draws there).
PIPE_WIDTH = 120
# The narrowest a column is cut to (4 characters and an ellipsis) before columns are left out of a table.
MIN_COLUMN = 5
# A result of at most this many rows prints without its row count under the table (as DuckDB's renderer).
QUIET_ROWS = 10
# The most lines a cut cell of words wraps onto (a sentence of mob_check's at the pipe width takes 3).
WRAP_LINES = 3


def scan(rel, exprs: list[str], each) -> None:
    """Run ``rel`` once, projected on ``exprs`` (positional: repeated column names stay apart), and call
    ``each`` with every Arrow batch of :data:`BATCH_ROWS` rows. The reader is closed however it ends (DuckDB
    refuses the connection's next query while a result is open); an error while the result streams (Arrow
    raises it as OSError, with DuckDB's message) is raised as a ``duckdb.Error``."""
    reader = rel.project(", ".join(exprs)).to_arrow_reader(BATCH_ROWS)
    try:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (OSError, pa.ArrowException) as exc:
                raise duckdb.Error(str(exc)) from exc
            each(batch)
    finally:
        reader.close()


def text_rows(batches: list[pa.RecordBatch], cells) -> list[list[str]]:
    """The rows of ``batches`` as text, column ``i`` written by ``cells[i]``."""
    rows: list[list[str]] = []
    for batch in batches:
        columns = [[cell(v) for v in column.to_pylist()] for cell, column in zip(cells, batch.columns)]
        rows.extend(map(list, zip(*columns)))
    return rows


def format_double(x: float) -> str:
    """A DOUBLE or FLOAT as the shell shows it: 4 significant digits (the rule is in the module docstring)."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    size = abs(x)
    if size == 0 or 1e-4 <= size < 1e6:
        if x.is_integer():
            return f"{x:.1f}"
        text = f"{x:.4g}" if size < 1000 else f"{x:.0f}"
        if float(text).is_integer():   # never a whole number for a value that is not: 3.0003, not 3
            decimals = next(d for d in range(1, 18) if not round(x, d).is_integer())
            text = f"{x:.{decimals}f}"
        return text
    return f"{x:.4g}"


# Control characters would break a table's lines: written as escapes (a newline as \n, as DuckDB's renderer does).
_ESCAPES = {i: f"\\x{i:02x}" for i in range(32)} | {9: "\\t", 10: "\\n", 13: "\\r", 127: "\\x7f"}


def text_cell(value) -> str:
    return "NULL" if value is None else value.translate(_ESCAPES)


def double_cell(value) -> str:
    return "NULL" if value is None else format_double(value)


_INTEGERS = {"TINYINT": "int8", "SMALLINT": "int16", "INTEGER": "int32", "BIGINT": "int64", "HUGEINT": "int128",
             "UTINYINT": "uint8", "USMALLINT": "uint16", "UINTEGER": "uint32", "UBIGINT": "uint64",
             "UHUGEINT": "uint128"}
_INTEGER_NAME = re.compile(r"\b(?:" + "|".join(_INTEGERS) + r")\b")


def display_type(duckdb_type: str) -> str:
    """A column's type as DuckDB's renderer writes it under the name: ``int64``, ``double``, ``varchar[]``."""
    return _INTEGER_NAME.sub(lambda m: _INTEGERS[m.group(0)], duckdb_type).lower()


def is_number(duckdb_type: str) -> bool:
    """Whether a column is numeric (right-aligned)."""
    return duckdb_type in _INTEGERS or duckdb_type in ("DOUBLE", "FLOAT") or duckdb_type.startswith("DECIMAL")


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def text_width(text: str) -> int:
    """The columns ``text`` takes in a terminal (a CJK character takes two, a combining accent none)."""
    return len(text) if text.isascii() else sum(map(_char_width, text))


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` columns, ending in an ellipsis where it was cut."""
    if text_width(text) <= width:
        return text
    kept, used = [], 0
    for char in text:
        used += _char_width(char)
        if used > width - 1:
            break
        kept.append(char)
    return "".join(kept) + "…"


def _wrap(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` columns: whole when it fits; a text of words wrapped at its spaces onto
    at most :data:`WRAP_LINES` lines (a word wider than a line split), the last ending in ``…`` if more was left;
    any other text cut to one line (:func:`_cut`)."""
    if text_width(text) <= width or " " not in text.strip():
        return [_cut(text, width)]
    lines, line = [], ""
    for word in text.split():
        joined = f"{line} {word}" if line else word
        if text_width(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        while text_width(word) > width:
            head = _cut(word, width + 1)[:-1]  # the first ``width`` columns of the word, without the ellipsis
            lines.append(head)
            word = word[len(head):]
        line = word
    lines.append(line)
    if len(lines) > WRAP_LINES:
        last = _cut(lines[WRAP_LINES - 1], width - 1)
        lines = lines[:WRAP_LINES - 1] + [last if last.endswith("…") else last + "…"]
    return lines


def _pad(text: str, width: int, align: str) -> str:
    gap = width - text_width(text)
    if align == ">":
        return " " * gap + text
    if align == "^":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def fit_columns(natural: list[int], room: int) -> list[int] | None:
    """Column widths that fit ``room`` characters of cells: the widest columns are cut first, all to the same
    cap (the largest that fits; what is left over widens the cut ones by a character each). None when even
    :data:`MIN_COLUMN` characters each would not fit."""
    if sum(natural) <= room:
        return list(natural)
    if sum(min(w, MIN_COLUMN) for w in natural) > room:
        return None
    low, high = MIN_COLUMN, max(natural)
    while low < high:
        cap = (low + high + 1) // 2
        if sum(min(w, cap) for w in natural) <= room:
            low = cap
        else:
            high = cap - 1
    widths = [min(w, low) for w in natural]
    spare = room - sum(widths)
    for i, w in enumerate(natural):
        if spare and w > widths[i]:
            widths[i] += 1
            spare -= 1
    return widths


def draw_box(names: list[str], types: list[str], right: list[bool], first: list[list[str]],
             last: list[list[str]], total: int, width: int) -> list[str]:
    """The lines of a duckbox table at most ``width`` characters wide: ``first`` and ``last`` rows (text), with
    a row of dots between them when the result has ``total`` rows, more than they hold. Columns are cut (the
    widest first) by :func:`fit_columns`; only if that cannot fit them, middle columns are left out."""
    rows = first + last
    natural = [max([text_width(n), text_width(t)] + [text_width(r[i]) for r in rows])
               for i, (n, t) in enumerate(zip(names, types))]
    keep = list(range(len(names)))
    while True:
        gap = len(keep) < len(names)  # a "…" column stands for the columns left out
        room = width - 3 * (len(keep) + gap) - 1 - gap
        widths = fit_columns([natural[i] for i in keep], room)
        if widths is not None or len(keep) == 1:
            break
        del keep[len(keep) // 2]
    if widths is None:
        widths = [max(1, room)]
    aligns = [">" if right[i] else "<" for i in keep]
    at = next((j for j in range(1, len(keep)) if keep[j] != keep[j - 1] + 1), None)
    if at is not None:
        widths.insert(at, 1)
        aligns.insert(at, "<")

    def line(values: list[str], align: str | None = None) -> str:
        values = [values[i] for i in keep]
        if at is not None:
            values.insert(at, "…")
        return "│" + "│".join(" " + _pad(_cut(v, w), w, align or a) + " "
                              for v, w, a in zip(values, widths, aligns)) + "│"

    def row_lines(values: list[str]) -> list[str]:
        """One row: its text cells of words wrapped (:func:`_wrap`) over as many lines as the longest needs."""
        values = [values[i] for i in keep]
        if at is not None:
            values.insert(at, "…")
        cells = [_wrap(v, w) if a == "<" else [_cut(v, w)] for v, w, a in zip(values, widths, aligns)]
        height = max(map(len, cells))
        return ["│" + "│".join(" " + _pad(c[k] if k < len(c) else "", w, a) + " "
                               for c, w, a in zip(cells, widths, aligns)) + "│" for k in range(height)]

    def rule(left: str, middle: str, end: str) -> str:
        return left + middle.join("─" * (w + 2) for w in widths) + end

    out = [rule("┌", "┬", "┐"), line(names, "^"), line(types, "^")]
    if rows:
        out.append(rule("├", "┼", "┤"))
        out += [text for r in first for text in row_lines(r)]
        if total > len(rows):
            out += [line(["·"] * len(names))] * 3
        out += [text for r in last for text in row_lines(r)]
    out.append(rule("└", "┴", "┘"))
    notes = []
    if total > len(rows) or total > QUIET_ROWS or total == 0:
        shown = f" ({len(rows):,} shown)" if total > len(rows) else ""
        notes.append(f"{total:,} row{'' if total == 1 else 's'}{shown}")
    if len(keep) < len(names):
        notes.append(f"{len(names)} columns ({len(keep)} shown)")
    spaces = len(out[0]) - 4 - sum(map(len, notes))  # both notes on one line under the table, where they fit
    if len(notes) == 2 and spaces > 0:
        notes = [notes[0] + " " * spaces + notes[1]]
    return out + ["  " + note for note in notes]


class CsvWriter:
    """``.mode csv``: a header, then the rows as CSV quotes them; NULL is an empty field."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.writer = csv.writer(out, lineterminator="\n")
        self.writer.writerow(names)

    def batch(self, batch: pa.RecordBatch) -> None:
        self.writer.writerows(zip(*(["" if v is None else v for v in c.to_pylist()] for c in batch.columns)))

    def end(self) -> None:
        pass


class LineWriter:
    """``.mode line``: ``name = value`` per column, names right-aligned, a blank line between rows."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.first = out, True
        size = max(map(text_width, names))
        self.labels = [_pad(n, size, ">") for n in names]

    def batch(self, batch: pa.RecordBatch) -> None:
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            self.out.write(("" if self.first else "\n") + "".join(
                f"{label} = {'NULL' if v is None else v}\n" for label, v in zip(self.labels, row)))
            self.first = False

    def end(self) -> None:
        pass


class JsonWriter:
    """``.mode json``: an array of one object per row, each value as DuckDB's ``to_json`` writes it."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.first = out, True
        self.keys = [json.dumps(n) + ":" for n in names]

    def batch(self, batch: pa.RecordBatch) -> None:
        for row in zip(*(c.to_pylist() for c in batch.columns)):
            self.out.write(("[" if self.first else ",\n") + "{" + ",".join(
                k + ("null" if v is None else v) for k, v in zip(self.keys, row)) + "}")
            self.first = False

    def end(self) -> None:
        self.out.write("[]\n" if self.first else "]\n")


class MarkdownWriter:
    """``.mode markdown``: a pipe table, numbers right-aligned (every row is held, to size the columns)."""

    def __init__(self, out, names: list[str], right: list[bool]):
        self.out, self.names, self.right = out, names, right
        self.rows: list[list[str]] = []

    def batch(self, batch: pa.RecordBatch) -> None:
        columns = [[text_cell(v).replace("|", "\\|") for v in c.to_pylist()] for c in batch.columns]
        self.rows.extend(map(list, zip(*columns)))

    def end(self) -> None:
        names = [n.replace("|", "\\|") for n in self.names]
        widths = [max([3, text_width(n)] + [text_width(r[i]) for r in self.rows]) for i, n in enumerate(names)]
        aligns = [">" if r else "<" for r in self.right]

        def line(values, align=None):
            return "| " + " | ".join(_pad(v, w, align or a) for v, w, a in zip(values, widths, aligns)) + " |\n"

        self.out.write(line(names, "<") + "|" + "|".join("-" * (w + 1) + (":" if r else "-")
                                                           for w, r in zip(widths, self.right)) + "|\n")
        self.out.writelines(line(r) for r in self.rows)


def write_result(rel, path: str) -> None:
    """Write a query result to Parquet or CSV, chosen by the file's extension."""
    if path.endswith(".parquet"):
        rel.write_parquet(path)
    elif path.endswith(".csv"):
        rel.write_csv(path, header=True)
    else:
        raise DuckmobError(f"cannot write {path!r}: name a .parquet or .csv file")


__all__ = ["format_double", "text_width", "fit_columns", "draw_box", "write_result", "BATCH_ROWS", "PIPE_WIDTH",
           "MIN_COLUMN", "QUIET_ROWS", "WRAP_LINES"]
