"""The way dependencies run: no import circle between duckmob's modules (function-level imports included), and
neither the methods (synth/), the input path (source/) nor the mechanisms (privacy/) reach the SQL layer or the
release core."""

import ast
import pathlib

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
    ``if TYPE_CHECKING:`` (annotations only, never run)."""
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
    return {m for m in found if m in modules}


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
    shared = [m for m in graph if m.startswith("duckmob.synth") and not m.startswith(
        tuple(f"duckmob.synth.{m}" for m in METHOD_PACKAGES))]
    for module in shared:   # nor does a shared module reach into a method
        bad = {m for m in graph[module] if m.startswith(tuple(f"duckmob.synth.{m}" for m in METHOD_PACKAGES))}
        assert not bad, (module, bad)


def test_no_module_is_over_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}
