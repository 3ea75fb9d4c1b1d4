"""SQL text as the shell reads it: where a statement ends, whether text holds one, and which need duckmob.

DuckDB's own tokenizer decides (``duckdb.tokenize``), so a ``;`` or ``--`` inside a string or a quoted name is
left alone, as in the DuckDB CLI.
"""

from __future__ import annotations

import re

import duckdb

# A statement that names one of these needs duckmob's functions registered first (duckmob.cli.shell: start-up).
NEEDS_DUCKMOB = re.compile(r"(?i)\b_?(?:mob_|duckmob_)\w*|\bsynthesize\b")


def bare(query: str) -> str:
    """A statement without its trailing ';' and comments (DuckDB keeps them in the statement's text, and a
    relation shown as a table re-reads that text inside a subquery, where they break the parse). DuckDB's own
    tokenizer finds them, so a ';' or '--' inside a string is left alone."""
    tokens = duckdb.tokenize(query)
    end = len(query)
    for start, kind in reversed(tokens):
        if kind == duckdb.token_type.comment or (kind == duckdb.token_type.operator
                                                  and query[start:end].strip().startswith(";")):
            end = start
        else:
            break
    return query[:end].rstrip()


def _code_tokens(text: str) -> list[tuple[int, object]]:
    """DuckDB's tokens of ``text`` without its comments."""
    return [t for t in duckdb.tokenize(text) if t[1] != duckdb.token_type.comment]


def complete(text: str) -> bool:
    """True when ``text`` ends where a statement may begin: nothing but comments, or a last ';' outside strings,
    quoted names and comments (DuckDB's tokenizer decides; an unclosed string is one token, so it ends nothing)."""
    tokens = _code_tokens(text)
    if not tokens:
        return True
    start, kind = tokens[-1]
    return kind == duckdb.token_type.operator and text[start] == ";"


def has_statement(text: str) -> bool:
    """Whether ``text`` holds any SQL (not only blanks and comments)."""
    return bool(_code_tokens(text))

