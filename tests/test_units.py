"""Readable units: no function or method in duckmob/ is over 80 lines, counted from its ``def`` line to the last
line of its body (docstring, comments and blank lines inside included; decorators not), so it stays true."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "duckmob"
LIMIT = 80


def _lengths(path: pathlib.Path) -> dict[str, int]:
    """``'file:line name'`` -> lines, for every function and method (nested ones too) in ``path``."""
    tree = ast.parse(path.read_text())
    return {f"{path.name}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_function_is_over_80_lines():
    long = {f"{path.relative_to(ROOT)} {name}": n for path in ROOT.rglob("*.py")
            for name, n in _lengths(path).items() if n > LIMIT}
    assert long == {}


def test_the_counter_counts_from_def_to_the_last_line(tmp_path):
    source = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source.write_text(f"@decorated\ndef long():\n    '''Doc.'''\n{body}\n\n\nclass C:\n    def short(self):\n"
                      "        return 1\n")
    assert _lengths(source) == {"m.py:2 long": 82, "m.py:87 short": 2}
