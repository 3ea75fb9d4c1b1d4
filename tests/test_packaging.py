"""The package as a user installs it: a wheel built from this tree holds every module, the SQL macros and the GeoLife
sample, declares the extras, and once installed in a fresh virtual environment its ``duckmob demo`` runs.

Offline and fast (about 10 s): the wheel is built with the setuptools already installed (``--no-build-isolation``,
``--no-index``), and the new environment borrows the dependencies of the environment pytest runs in (duckmob itself
with ``--no-deps``), so nothing is downloaded. It borrows them through a ``.pth`` file naming this interpreter's
site-packages, not ``--system-site-packages``: that flag borrows the base interpreter's packages, which in a virtual
environment are not the ones installed for the tests. The build runs in a copy of the tree, so no build/ or
egg-info is left in the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)


def _clean_env():
    """This environment without PYTHONPATH, so that nothing but the installed wheel can provide duckmob."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "duckmob", src / "duckmob", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
              "-w", tmp / "dist", src])
    assert r.returncode == 0, r.stderr
    (path,) = (tmp / "dist").glob("duckmob-*.whl")
    return tmp, src, path


def test_the_wheel_holds_every_module_the_sql_and_the_sample(wheel):
    tmp, src, path = wheel
    names = set(zipfile.ZipFile(path).namelist())
    shipped = {p.relative_to(src).as_posix() for p in (src / "duckmob").rglob("*") if p.is_file()}
    assert shipped - names == set(), "in the tree but not in the wheel (package-data or a missing __init__.py?)"
    assert "duckmob/data/geolife_sample.parquet" in names
    assert {"duckmob/sql/privacy.sql", "duckmob/sql/synth.sql", "duckmob/sql/trajectories.sql",
            "duckmob/sql/evaluate.sql"} <= names
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(path).read(metadata).decode()
    assert {"Provides-Extra: jupyter", "Provides-Extra: dbt", "Provides-Extra: all",
            "Provides-Extra: test"} <= set(text.splitlines())
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "duckmob = duckmob.cli:main" in zipfile.ZipFile(path).read(entry_points).decode()


def test_duckmob_demo_runs_from_the_installed_wheel(wheel):
    tmp, _, path = wheel
    venv = tmp / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert r.returncode == 0, r.stderr
    python = venv / "bin" / "python"
    # the dependencies installed where pytest runs, after the new environment's own site-packages. A path line in a
    # .pth file adds the folder but not the .pth files inside it, so a development install's editable duckmob
    # (itself a .pth file there) stays out of sight
    r = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    assert r.returncode == 0, r.stderr
    borrowed = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(r.stdout.strip()) / "_duckmob_test_borrowed.pth").write_text("\n".join(borrowed) + "\n")
    # pip installs into the new environment from outside it (--python: no pip of its own to set up), whatever
    # duckmob the borrowed site-packages already has (the editable one of a development install)
    r = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
              "--ignore-installed", "-q", path], env=_clean_env())
    assert r.returncode == 0, r.stderr
    work = tmp / "work"  # not the repository: its duckmob/ folder must not be importable from the working dir
    work.mkdir()
    r = _run([python, "-c", "import duckmob; print(duckmob.__file__)"], cwd=work, env=_clean_env())
    assert r.returncode == 0 and Path(r.stdout.strip()).is_relative_to(venv), r.stdout + r.stderr
    r = _run([venv / "bin" / "duckmob", "demo"], cwd=work, env=_clean_env())
    assert r.returncode == 0, r.stderr
    assert "1,999 trajectories" in r.stdout and "PrivTrace at eps 1.0" in r.stdout
