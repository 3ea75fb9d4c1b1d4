"""The documentation's examples run as written.

README.md: every ```sql and ```python block, in order, in an empty folder. SQL blocks run statement by statement on
one duckmob connection to ``trips.duckdb`` there (what ``duckmob trips.duckdb`` opens, the shell the README
tells a user to paste them into); each Python block runs as a script of its own in a fresh interpreter
(``PYTHONPATH`` set to this checkout), in the same folder, twice over (the README says it can be run again).

docs/sql.md: the blocks marked runnable, in order, on one in-memory connection holding the shipped sample as
``trips`` (what the reference says its examples were run on). The marker is the fence's info string::

    ```sql runnable
    SELECT mob_parent(556, 32, 2);
    ```

(GitHub highlights it as SQL all the same). Unmarked blocks are examples too, not run here: those that take
minutes (an HRNet fit) or read files the package does not ship; a result quoted in one of them must say
"(illustration".

Quoted results cannot go stale: the comment lines that end a runnable block (``-- 1897 | 7794 | 0``) are the rows
its last statement returns, each checked against what it returns now (cells separated by ``|``; a cell ending in
``...`` is a prefix; text after three spaces is a note).

A failure names the file, the block's first line number, and the statement that broke.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import duckmob
from duckmob.demo import load_sample

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(path: Path, runnable_only: bool = False) -> list[tuple[str, int, str]]:
    """(language, line of the opening fence, code) of the ```sql and ```python blocks of ``path``, in order;
    with ``runnable_only``, only those whose info string says ``runnable``."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, info, code = m.group(1), m.group(2).split(), m.group(3)
        if lang not in ("sql", "python") or (runnable_only and "runnable" not in info):
            continue
        out.append((lang, text.count("\n", 0, m.start()) + 1, code))
    return out


def run_sql(con, code: str, where: str) -> int:
    """Run the block ``code`` statement by statement; check the rows it quotes (if any) against what its last
    statement returns; the number of quoted rows checked."""
    rows = None
    for stmt in con.extract_statements(code):
        try:
            rows = con.execute(stmt.query).fetchall()
        except Exception as exc:  # noqa: BLE001 -- reported with the block and statement
            pytest.fail(f"{where}: {' '.join(stmt.query.split())[:200]!r} failed: {exc}", pytrace=False)
    quoted = quoted_rows(code)
    if quoted:
        got = [["NULL" if v is None else str(v) for v in row] for row in (rows or [])]
        ok = len(got) >= len(quoted) and all(
            len(q) == len(g) and all(c == v or (c.endswith("...") and v.startswith(c[:-3])) for c, v in zip(q, g))
            for q, g in zip(quoted, got))
        if not ok:
            shown = "\n".join("-- " + " | ".join(g) for g in got[:len(quoted) + 2])
            pytest.fail(f"{where}: the quoted result is stale; the block now returns:\n{shown}", pytrace=False)
    return len(quoted)


def quoted_rows(code: str) -> list[list[str]]:
    """The result rows quoted by the comment lines that end a block (see the module docstring)."""
    lines = code.rstrip("\n").split("\n")
    tail = []
    for line in reversed(lines):
        if not line.startswith("--"):
            break
        tail.append(line[2:].strip())
    rows = []
    for line in reversed(tail):
        line = re.split(r"(?<=[^\s|])\s{3,}(?=[^\s|])", line)[0]   # a note after three spaces (not a column)
        rows.append([c.strip() for c in line.split("|")])
    return rows if any("|" in line for line in tail) else []


RELEASED = re.compile(r"CREATE\s+TABLE\s+(\w+)\s+AS\s+FROM\s+(?:synthesize|mob_sample)\s*\(", re.I)


def check_releases(con, tables: list[str], where: str) -> None:
    """What the blocks run on ``con`` released: each synthetic table they created holds trajectories, and every
    release in the ledger was charged and completed (none failed, pending or cancelled)."""
    for name in tables:
        n = con.execute(f"SELECT count(DISTINCT traj_id) FROM {name}").fetchone()[0]
        assert n > 0, f"{where}: the synthetic table {name} is empty"
    statuses = [r[0] for r in con.execute("SELECT status FROM mob_ledger()").fetchall()]
    assert statuses and set(statuses) == {"spent"}, f"{where}: ledger statuses {statuses}"


def run_python(code: str, where: str, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.fail(f"{where} failed (exit {r.returncode}):\n{r.stderr[-3000:]}", pytrace=False)


def test_blocks_are_found():
    readme = blocks(ROOT / "README.md")
    assert [lang for lang, _, _ in readme].count("sql") >= 2 and any(lang == "python" for lang, _, _ in readme)
    assert len(blocks(ROOT / "docs" / "sql.md", runnable_only=True)) >= 10


def test_readme_blocks_run_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    con = duckmob.connect(str(tmp_path / "trips.duckdb"))
    try:
        for lang, line, code in blocks(ROOT / "README.md"):
            where = f"README.md, the {lang} block at line {line}"
            if lang == "sql":
                run_sql(con, code, where)
            else:  # twice: the README says the snippet can be run again as it is
                run_python(code + "\n" + code, where + " (run twice)", tmp_path)
        # what the tour says it leaves behind
        tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
        assert {"trips", "synth", "synth_big"} <= tables
        assert (tmp_path / "density.png").stat().st_size > 0
        assert con.execute("SELECT count(*) FROM mob_ledger() WHERE status = 'spent'").fetchone()[0] == 2
    finally:
        con.close()


def test_sql_reference_runnable_blocks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    con = duckmob.connect()
    try:
        load_sample(con)
        found = blocks(ROOT / "docs" / "sql.md", runnable_only=True)
        checked = 0
        for lang, line, code in found:
            where = f"docs/sql.md, the {lang} block at line {line}"
            if lang == "sql":
                checked += run_sql(con, code, where)
            else:
                run_python(code, where, tmp_path)
        # every quoted row was compared, and what the examples released is there
        assert checked == sum(len(quoted_rows(code)) for lang, _, code in found if lang == "sql") >= 5
        check_releases(con, [t for _, _, code in found for t in RELEASED.findall(code)], "docs/sql.md")
    finally:
        con.close()


def test_choosing_eps_runnable_blocks(tmp_path, monkeypatch):
    """docs/choosing_eps.md: its runnable blocks in order; a block that creates ``trips`` starts a new database."""
    monkeypatch.chdir(tmp_path)
    con, made, checked, databases = None, [], 0, 0
    try:
        for lang, line, code in blocks(ROOT / "docs" / "choosing_eps.md", runnable_only=True):
            if con is None or code.lstrip().startswith("CREATE TABLE trips"):
                if con is not None:   # what the blocks released in the database they leave
                    check_releases(con, made, f"docs/choosing_eps.md, database {databases}")
                    con.close()
                con, made, databases = duckmob.connect(), [], databases + 1
            checked += run_sql(con, code, f"docs/choosing_eps.md, the {lang} block at line {line}")
            made += RELEASED.findall(code)
        check_releases(con, made, f"docs/choosing_eps.md, database {databases}")
        assert checked >= 3 and databases >= 2
    finally:
        if con is not None:
            con.close()


def test_quoted_results_in_blocks_that_do_not_run_are_marked_illustrations():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for lang, line, code in blocks(path):
            if lang == "sql" and quoted_rows(code) and (line, code) not in [
                    (ln, c) for _, ln, c in blocks(path, runnable_only=True)]:
                assert "(illustration" in code, f"{path.name}, the block at line {line}: a quoted result not checked"


def test_a_stale_quoted_result_is_named():
    con = duckmob.connect()
    run_sql(con, "SELECT 1 AS a, 'x' AS b;\n-- 1 | x   (a note)\n", "doc.md, block 1")
    with pytest.raises(pytest.fail.Exception, match="stale; the block now returns:\n-- 2 \\| x"):
        run_sql(con, "SELECT 2 AS a, 'x' AS b;\n-- 1 | x\n", "doc.md, block 2")
    con.close()


def test_a_broken_block_is_named(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n```sql runnable\nSELECT 1;\nSELECT * FROM no_such_table;\n```\n\n```sql\nSELECT nope;\n```\n")
    (found,) = blocks(doc, runnable_only=True)
    assert found[:2] == ("sql", 3) and len(blocks(doc)) == 2
    con = duckmob.connect()
    with pytest.raises(pytest.fail.Exception, match=r"doc.md, block 3: 'SELECT \* FROM no_such_table;' failed: "
                                                    r"Catalog Error"):
        run_sql(con, found[2], "doc.md, block 3")
    con.close()
