"""The way dependencies run: no import circle between duckmob's modules (function-level imports included), and
neither the methods (synth/), the input path (source/) nor the mechanisms (privacy/) reach the SQL layer or the
release core."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "duckmob"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: pathlib.Path, modules) -> set[str]:
    """The duckmob modules ``path`` imports anywhere (module level or inside functions), except under
    ``if TYPE_CHECKING:`` (annotations only, never run): import statements, ``importlib.import_module`` (and
    ``__import__``) calls, and string imports (:func:`_named`)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "duckmob":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "duckmob")
        elif _imports_by_name(node) and node.args:
            found.update(_named(node.args[0], modules))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
            found.update(_named(node, modules))   # a dotted name: not the word "duckmob" in a message
    return {m for m in found if m in modules}


def _imports_by_name(node) -> bool:
    """Whether ``node`` is a call of ``importlib.import_module``, ``import_module`` or ``__import__``."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    return name in ("import_module", "__import__")


def _named(arg, modules) -> set[str]:
    """The modules a string names: a constant that is a module's name (``'duckmob.sql.demo'``, or the
    ``'duckmob.synth.hrnet:HRNet'`` of a registry of lazily imported classes); an f-string
    (``f"duckmob.sql.{area}"``) any module its constant text and one name in place of each field could be."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        name = arg.value.partition(":")[0]
        return {name} if name in modules else set()
    if isinstance(arg, ast.JoinedStr):
        pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"[A-Za-z_][A-Za-z0-9_]*"
                          for v in arg.values)
        if pattern.startswith("duckmob"):
            return {m for m in modules if re.fullmatch(pattern, m)}
    return set()


def _graph():
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_methods_input_path_and_mechanisms_do_not_reach_sql_or_the_release_core():
    graph = _graph()
    lower = [m for m in graph if m.startswith(("duckmob.synth", "duckmob.source", "duckmob.privacy"))]
    assert any(m.startswith("duckmob.source") for m in lower) and any(m.startswith("duckmob.synth") for m in lower)
    for module in lower:
        bad = {m for m in graph[module] if m.startswith(("duckmob.sql", "duckmob.release")) or m == "duckmob"}
        assert not bad, (module, bad)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_import_module_calls_and_string_imports_are_edges(tmp_path):
    """What the first version missed (api -> sql -> sql.demo -> demo -> api ran through an f-string
    import_module): calls of import_module with a constant or an f-string, and a registry's 'module:Class'."""
    source = tmp_path / "m.py"
    source.write_text("import importlib\nfrom importlib import import_module\n"
                      "AREAS = ('a', 'b')\nMETHODS = {'x': 'duckmob.synth.x:X'}\n"
                      "def areas():\n    return [importlib.import_module(f'duckmob.sql.{a}') for a in AREAS]\n"
                      "def demo():\n    return import_module('duckmob.demo')\n"
                      "def said():\n    return 'duckmob'   # a word, not an import\n")
    modules = {m: None for m in ("duckmob", "duckmob.sql", "duckmob.sql.a", "duckmob.sql.b", "duckmob.sql.a.deep",
                                 "duckmob.demo", "duckmob.synth.x", "duckmob.synth.y")}
    assert _imports(source, modules) == {"duckmob.sql.a", "duckmob.sql.b", "duckmob.demo", "duckmob.synth.x"}


METHOD_PACKAGES = ("privtrace", "hrnet", "pategail", "cleanslate")


def test_no_method_imports_another():
    """Each method package reads only shared modules (synth/base, placement, dpsgd, neural, cells, privacy/...)."""
    graph = _graph()
    for method in METHOD_PACKAGES:
        own = f"duckmob.synth.{method}"
        others = tuple(f"duckmob.synth.{m}" for m in METHOD_PACKAGES if m != method)
        for module in (m for m in graph if m == own or m.startswith(own + ".")):
            bad = {m for m in graph[module] if m.startswith(others)}
            assert not bad, (module, bad)
    shared = [m for m in graph if m.startswith("duckmob.synth.") and not m.startswith(
        tuple(f"duckmob.synth.{m}" for m in METHOD_PACKAGES))]   # not the registry, duckmob.synth: it names them
    for module in shared:   # nor does a shared module reach into a method
        bad = {m for m in graph[module] if m.startswith(tuple(f"duckmob.synth.{m}" for m in METHOD_PACKAGES))}
        assert not bad, (module, bad)


def test_no_module_is_over_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}
