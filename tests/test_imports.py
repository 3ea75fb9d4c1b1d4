"""The way dependencies run: no import circle between duckmob's modules (function-level imports, ``importlib`` calls
and annotation-only imports included, inside a package as between packages), no private name (``_x``) read from
another module, no arrow back up (to the package root, or from the core to a face), and neither the methods (synth/),
the input path (source/) nor the mechanisms (privacy/) reach the SQL layer or the release core."""

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


def _imports(path: pathlib.Path, modules, name: str = "") -> set[str]:
    """The duckmob modules ``path`` (the module ``name``) imports anywhere: at module level, inside functions and
    under ``if TYPE_CHECKING:`` (an annotation that names a module is a dependency on it all the same: two modules
    that name each other are one concern split in two); import statements, relative ones included,
    ``importlib.import_module`` (and ``__import__``) calls, and string imports (:func:`_named`)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (module := _absolute(node, name, path)).split(".")[0] == "duckmob":
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in modules else module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "duckmob")
        elif _imports_by_name(node) and node.args:
            found.update(_named(node.args[0], modules))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
            found.update(_named(node, modules))   # a dotted name: not the word "duckmob" in a message
    return {m for m in found if m in modules}


def _absolute(node: ast.ImportFrom, name: str, path: pathlib.Path) -> str:
    """The module a ``from ... import`` names, a relative one (``from .registry import x``) resolved against the
    module ``name`` (a package's ``__init__`` is its own package)."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


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
        if not re.fullmatch(r"[\w.]+(:[\w.]+)?", arg.value):   # a message ("duckmob: ...") names no module
            return set()
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
    return {name: _imports(path, modules, name) - {name} for name, path in modules.items()}


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


# The faces: what a user calls (the Python API, the SQL layer, the shell, Jupyter, Spark, dbt, the demo, the report
# page, ``python -m duckmob``). Everything else is the core they stand on.
FACES = ("duckmob.api", "duckmob.sql", "duckmob.cli", "duckmob.jupyter", "duckmob.spark", "duckmob.dbt",
         "duckmob.demo", "duckmob.report", "duckmob.__main__")


def _is_face(module: str) -> bool:
    return any(module == face or module.startswith(face + ".") for face in FACES)


def test_no_arrow_runs_back_up():
    """Nothing imports the package root ``duckmob`` (the top: it names the API), and no module of the core (the
    release core, the mechanisms, the methods, the input path, the metrics) reaches a face."""
    graph = _graph()
    assert all(m in graph for m in FACES)
    assert {m for m, deps in graph.items() if "duckmob" in deps} == set()
    up = {m: bad for m, deps in graph.items() if m != "duckmob" and not _is_face(m)
          and (bad := {d for d in deps if _is_face(d)})}
    assert up == {}


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
                      "def said():\n    return 'duckmob'   # a word, not an import\n"
                      "def told():\n    return 'duckmob: no table or view. Create it first'   # a message\n")
    modules = {m: None for m in ("duckmob", "duckmob.sql", "duckmob.sql.a", "duckmob.sql.b", "duckmob.sql.a.deep",
                                 "duckmob.demo", "duckmob.synth.x", "duckmob.synth.y")}
    assert _imports(source, modules) == {"duckmob.sql.a", "duckmob.sql.b", "duckmob.demo", "duckmob.synth.x"}


def test_annotation_only_relative_and_function_level_imports_are_edges(tmp_path):
    """A circle inside a package that the first version missed: registry named protocol's Release under
    ``if TYPE_CHECKING:`` while protocol imported registry; a relative or a function-level import counts too."""
    package = tmp_path / "release"
    package.mkdir()
    (package / "__init__.py").write_text("from . import protocol\n")
    (package / "registry.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from duckmob.release.protocol import Release\n")
    (package / "protocol.py").write_text("def f():\n    from .registry import database\n    return database\n")
    modules = {m: None for m in ("duckmob.release", "duckmob.release.registry", "duckmob.release.protocol")}
    graph = {m: _imports(package / f"{m.rpartition('.')[2]}.py" if m.count(".") > 1 else package / "__init__.py",
                         modules, m) - {m} for m in modules}
    assert graph == {"duckmob.release": {"duckmob.release.protocol"},
                     "duckmob.release.registry": {"duckmob.release.protocol"},
                     "duckmob.release.protocol": {"duckmob.release.registry"}}
    assert _cycles(graph) == [["duckmob.release.protocol", "duckmob.release.registry"]]


def _private_reads(path: pathlib.Path, name: str, modules) -> set[str]:
    """The private names (``_x``, not ``__x__``) of other duckmob modules that the module ``name`` reads: imported
    (``from duckmob.release.registry import _DATABASES``) or as an attribute of a module it imported
    (``registry._DATABASES``), as ``"module._x"``."""
    tree = ast.parse(path.read_text())
    bound, found = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (module := _absolute(node, name, path)).split(".")[0] == "duckmob":
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
                elif module != name and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{module}.{alias.name}")
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            text = ast.unparse(node.value)   # a bound name (registry) or a dotted module (duckmob.release.registry)
            module = bound.get(text, text if text in modules and text.startswith("duckmob.") else None)
            if module is not None and module != name:
                found.add(f"{module}.{node.attr}")
    return found


def test_no_module_reads_another_modules_private_names():
    """Modules talk through public names: what one needs of another is that one's interface, named so (the
    ledger's __init__ once imported some 25 private names; release.interrupts read registry._DATABASES)."""
    modules = _modules()
    found = {name: reads for name, path in modules.items() if (reads := _private_reads(path, name, modules))}
    assert found == {}


def test_the_private_name_finder(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from duckmob.release import registry\nfrom duckmob.cli.output import _rows, write\n"
                      "from duckmob import __version__\nimport duckmob.synth.store as store\n"
                      "import duckmob.synth.base\n"
                      "def f(self):\n    return registry._DATABASES, store._DDL, self._own, registry.database\n"
                      "def g():\n    return duckmob.synth.base._plan\n")
    modules = {m: None for m in ("duckmob", "duckmob.release", "duckmob.release.registry", "duckmob.cli.output",
                                 "duckmob.synth.store", "duckmob.synth.base", "duckmob.m")}
    assert _private_reads(source, "duckmob.m", modules) == {
        "duckmob.release.registry._DATABASES", "duckmob.cli.output._rows", "duckmob.synth.store._DDL",
        "duckmob.synth.base._plan"}


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
