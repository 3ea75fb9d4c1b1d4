"""Releases of DuckDB relations: the one assembly that SQL and the Python API call.

Every function here first does what needs no row, before anything is reserved: the caller's catalog is checked
for shadowing temporary objects, the relation's lineage and column types are read from its plan and schema
(:func:`duckmob.source.table.prepare`), and the public arguments are validated. Only then does the release core
reserve the budget of every base table the relation reads, and read the rows (TRY_CAST: a value that cannot be
converted drops its point). ``con`` is the connection the relation is resolved and read on: the caller's own (the
Python API: it sees its temporary tables) or a cursor of the release core's connection set to the caller's
database and schema (SQL: a UDF cannot use the calling connection).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from duckmob import validators
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit, no_user_column
from duckmob.release import counting, fitting, outputs, sampling
from duckmob.release.protocol import read_ledger, set_budget as declare
from duckmob.release.registry import Database
from duckmob.source import ArrowSource, lineage
from duckmob.source.schema import Mapping
from duckmob.source.table import (Prepared, TableSource, content_version, count_query, grouped_sequences,
                                  pair_count, prepare, read_sequences, sequence_arrays, table_version)
from duckmob.synth import store


def home(db: Database) -> str:
    """The database whose ledger the release core keeps (its own connection's default database)."""
    with db.connection() as cur:
        return lineage.home(cur)


def check_shadowing(relation: str, temporary: list[str] | None, con=None) -> None:
    """Refuse (before anything is reserved) a relation that mentions one of the caller's temporary tables or
    views while it is read on another connection (``con``, which also finds those names in the views the relation
    reads), where that name means another object."""
    name = lineage.shadowing(relation, temporary, con)
    if name is not None:
        raise DuckmobError(f"duckmob: a temporary table or view named '{name}' hides the table or view of that name "
                           f"that {relation} reads: rename the temporary one (or drop it), then release again")


def _temporary(con) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()]


def _committed_shadowed(con, relation: str) -> None:
    """The Python API's shadowing check on the caller's connection: a temporary object that the relation mentions
    and that has the name of a committed one."""
    names = {n.lower() for n in _temporary(con)}
    committed = {r[0].lower() for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT temporary UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE NOT temporary AND NOT internal").fetchall()}
    check_shadowing(relation, sorted(names & committed))


def _needs_user_column(has_user: bool, unit: PrivacyUnit, relation: str) -> None:
    if unit.is_user and not has_user:
        raise no_user_column(f"'{relation}'")


def _prepared_fit(db: Database, con, relation: str, mapping: Mapping, owned: bool, caller_checked: bool,
                  request: dict) -> tuple[Prepared, fitting.FitRequest]:
    """The checks of a fit that read no row (see the module docstring); ``con`` is closed on a refusal if owned."""
    try:
        if not caller_checked:
            _committed_shadowed(con, relation)
        prepared = prepare(con, relation, mapping, home=home(db), shape="points")
        r = fitting.fit_request(source=prepared.lineage.source, **request)
        r = replace(r, stability=lineage.check_stability(prepared.lineage, r.stability))
        r = with_roads(db, con, r, prepared.lineage.keys)
        _needs_user_column(prepared.has_user, r.unit, relation)
    except BaseException:
        if owned:
            con.close()
        raise
    return prepared, r


def fit(db: Database, con, relation: str, *, mapping: Mapping, owned: bool = False, caller_checked: bool = False,
        **request):
    """Fit a method on ``relation`` read on ``con`` (one release): ``(model, ledger id, noise, FitRequest)``.
    ``request``: the public arguments of :func:`duckmob.release.fit_request` (without ``source``). ``owned``: close
    ``con`` after. ``caller_checked``: the caller's catalog was checked for shadowing already (SQL)."""
    prepared, r = _prepared_fit(db, con, relation, mapping, owned, caller_checked, request)
    model, ledger_id, noise = fitting.fit(db, r, TableSource(con, prepared.select, owned=owned))
    return model, ledger_id, noise, r


def synthesize(db: Database, con, relation: str, *, mapping: Mapping, owned: bool = False,
               caller_checked: bool = False, **request) -> sampling.Output:
    """Fit and open the output (``synthesize``): the synthetic table's :class:`~duckmob.release.sampling.Output`,
    drawn block by block as it is read. The same request again within a few minutes (a lazy DuckDB relation
    printed, then fetched) gets the same model and output seed back, so the same rows, charged once
    (:class:`Recent`)."""
    prepared, r = _prepared_fit(db, con, relation, mapping, owned, caller_checked, request)
    try:
        key = _key("synthesize", r.source, prepared.select, {**request, **(fitting.roads_record(r) or {})},
                   lambda: content_version(con, prepared.select))
    except BaseException:
        if owned:
            con.close()
        raise
    return _synthesized(db, key, r, lambda: TableSource(con, prepared.select, owned=owned),
                        con.close if owned else None)


def synthesize_gathered(db: Database, relation: str, temp_tables: list[str] | None, has_user: bool, points,
                        **request) -> sampling.Output:
    """:func:`synthesize` of rows a SQL macro gathered from the caller's temporary table (:func:`fit_gathered`)."""
    r = _gathered_fit(db, relation, temp_tables, has_user, request)
    table = points() if cache_on() else points   # loaded once: its version, then the release
    key = _key("synthesize", r.source, "", {**request, **(fitting.roads_record(r) or {})},
               lambda: table_version(table))
    return _synthesized(db, key, r, lambda: ArrowSource(table), None)


def cache_on() -> bool:
    """Whether a repeated request may get its earlier release again (:class:`Recent`); the environment variable
    ``DUCKMOB_RELEASE_CACHE=off`` turns it off: every request is then a new release, charged."""
    return os.environ.get("DUCKMOB_RELEASE_CACHE", "on").strip().lower() not in ("off", "0", "false", "no")


def _key(kind: str, source: str, select: str, request: dict, version: Callable[[], tuple[int, int]]) -> str | None:
    """A request's identity for :class:`Recent`, or None when the cache is off: everything that determines the
    release. The database is the :class:`Database` that keeps the cache; ``source`` names the resolved base tables
    (their budget keys); ``select`` is what is read from them, with its column mapping (empty for rows gathered from
    a temporary table, whose mapping is in ``request``); ``request`` holds the unit, every public parameter and the
    seed; ``version()`` is the content version of the rows the release would read (:func:`content_version`, which
    changes on any write: a DROP and CREATE, an INSERT, a DELETE, an UPDATE, another connection's temporary table
    of the same name with other rows). Anything else makes a new release, charged."""
    if not cache_on():
        return None
    return json.dumps([kind, source, select, request, list(version())], sort_keys=True, default=str)


def _synthesized(db: Database, key: str, r, source, close) -> sampling.Output:
    """The output of the release ``key`` made within the window, or make it (fit with ``source()``) and keep its
    model and output seed (a SeedSequence of its NoiseSource), so that the same request draws the same rows. The
    size check (:func:`fitting.output`) runs before any row is drawn; with an explicit n it ran before the
    reservation too (:func:`fitting.fit`)."""
    hit = _recent(db, key)
    if hit is None:
        model, ledger_id, noise = fitting.fit(db, r, source())
        seed = noise.output_seed()
        if key is not None:
            db.recent.put(key, (model, seed, ledger_id))
    else:
        if close is not None:
            close()
        model, seed, ledger_id = hit
    return fitting.output(fitting.on_roads(model, r.on_roads), r.n, seed, r.max_rows, desc=f"synthesize {r.method}",
                          threads=draw_threads(db),
                          on_first=outputs.recorder(db, ledger_id, model, bbox=r.synthesizer.bbox))


def sample(db: Database, name, n=None, seed=None, max_rows=None) -> sampling.Output:
    """The output of ``mob_sample``: ``n`` trajectories (None: the model's noisy count) of the stored model
    ``name`` under ``seed`` (None: OS entropy). Reads no data and spends nothing; refused before any row is drawn
    when it could have more than ``max_rows`` rows."""
    name = validators.model_name(name)
    n, seed, max_rows = validators.n_trajectories(n), validators.seed(seed), validators.max_rows(max_rows)
    model = _stored_model(db, name)
    described = read_ledger(db, lambda cur: store.described(cur, name))
    ledger_id = read_ledger(db, lambda cur: outputs.model_ledger_id(cur, name))
    return fitting.output(fitting.on_roads(model, _stored_roads(db, name, described)), n,
                          NoiseSource(seed).output_seed(), max_rows, desc=f"mob_sample {name}",
                          threads=draw_threads(db), on_first=outputs.recorder(db, ledger_id, model, name=name))


def _stored_model(db: Database, name: str):
    """The stored model ``name``, loaded and checked against its ledger row (``store.load``) at every call; a model
    whose sampling may run on several threads at once (``concurrent_sample``: PrivTrace) is then the one an earlier
    call loaded for the same stored row (name and checksum; :class:`~duckmob.release.registry.Loaded`), whose
    route tables are kept: a later output's first block reads them instead of computing them."""
    def loaded(cur):
        cur.execute("BEGIN TRANSACTION")        # the model and its checksum from one snapshot
        try:
            model = store.load(cur, name)[1]
            stored = cur.execute(f"SELECT checksum FROM {store.TABLE} WHERE name = ?", [name]).fetchone()[0]
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        return model, stored

    model, stored = read_ledger(db, loaded)
    if not getattr(model, "concurrent_sample", False):
        return model
    key = json.dumps([name, stored])
    kept = db.models.get(key)
    if kept is None:
        db.models.put(key, model)
    return model if kept is None else kept


def _stored_roads(db: Database, name: str, described: dict):
    """The public road network a stored model was fitted with, read again by its name and checked against the
    digest recorded at the fit (None: fitted without roads). A network changed since is refused: the output would
    no longer be the one the model's record describes."""
    if not described.get("roads"):
        return None
    from duckmob.roads import Roads

    roads = described["roads"]
    try:
        with db.connection() as cur:
            table = cur.sql(f"SELECT * FROM {roads}").to_arrow_table()
    except Exception:
        raise DuckmobError(f"model '{name}' was fitted with roads := '{roads}', which cannot be read now: restore that "
                           "table (committed), or fit the model again") from None
    found = Roads.of(table, name=roads).clip(described["roads_bbox"])
    if found.digest != described["roads_digest"]:
        raise DuckmobError(f"the roads table '{roads}' changed since model '{name}' was fitted (its rows' digest "
                           "differs): restore it, or fit the model again with the new roads")
    return found


def draw_threads(db: Database) -> int:
    """How many blocks an output may draw at once: DuckDB's ``threads`` setting of the database (``SET threads = 1``
    draws on the reading thread only), capped by :data:`~duckmob.release.sampling.MAX_THREADS`."""
    with db.connection() as cur:
        threads = cur.execute("SELECT current_setting('threads')").fetchone()[0]
    return min(max(int(threads), 1), sampling.MAX_THREADS)


def _recent(db: Database, key: str | None):
    """The result kept for ``key`` (:class:`Recent`; None: the cache is off), served only from a ledger that is
    still intact (a ledger rewritten since is reported, as any release would report it)."""
    hit = None if key is None else db.recent.get(key)
    if hit is not None:
        with db.lock, db.connection() as cur:
            ledger.verify(cur, db.verified)
    return hit


def _remembered(db: Database, key: str | None, make):
    hit = _recent(db, key)
    if hit is None:
        hit = make()
        if key is not None:
            db.recent.put(key, hit)
    return hit


def fit_gathered(db: Database, relation: str, temp_tables: list[str] | None, has_user: bool, points, **request):
    """Fit a method on rows a SQL macro gathered from the caller's temporary table ``relation`` (checked on its
    schema already: ``has_user``), ``points()`` giving them as an Arrow table. A relation that is no temporary table
    (a CTE, a temporary view: what it reads cannot be seen from here) is refused before anything is reserved."""
    r = _gathered_fit(db, relation, temp_tables, has_user, request)
    model, ledger_id, noise = fitting.fit(db, r, ArrowSource(points))
    return model, ledger_id, noise, r


def _gathered_fit(db: Database, relation: str, temp_tables: list[str] | None, has_user: bool,
                  request: dict) -> fitting.FitRequest:
    """The checks of a fit on gathered rows that read no row: their budget key, the public arguments, the user
    column the user unit needs, the public roads."""
    r = fitting.fit_request(source=gathered_key(relation, temp_tables), **request)
    _needs_user_column(has_user, r.unit, relation)
    if r.roads is not None:
        with db.connection() as cur:   # a public table the core's connection reads (committed)
            r = with_roads(db, cur, r, (r.source,))
    return r


def with_roads(db: Database, con, r: fitting.FitRequest, sensitive: tuple[str, ...]) -> fitting.FitRequest:
    """``r`` with its public road network read (``roads := 'table'``, on ``con``, clipped to the bbox), before
    anything is reserved: a public input costs no budget. Refused when the roads' lineage reads one of the tables
    the release reads (``sensitive``) or any table with a declared privacy budget: a network built from the
    sensitive traces is not public (which streets people use is what the release protects)."""
    if r.roads is None:
        return r
    from duckmob.roads import Roads

    try:
        found = lineage.resolve(con, r.roads, home(db))
    except lineage.Unplannable as exc:
        raise DuckmobError(f"{exc} -- roads := names a table or view of road segments (lat1, lon1, lat2, lon2): store "
                           "them as one first, e.g. CREATE TABLE roads AS FROM mob_sf_roads()") from None
    private = sorted(k for k in found.keys if k in sensitive or
                     read_ledger(db, lambda cur, k=k: ledger.budget(cur, k)) is not None)
    if private:
        raise DuckmobError(f"duckmob: roads := '{r.roads}' reads {', '.join(private)}, which has a privacy budget "
                           "(or is what this release reads): a road network built from the sensitive data is not "
                           "public. Give a public network: an OpenStreetMap extract (FROM mob_roads_from_osm(...)), a "
                           "city's GIS, or mob_sf_roads()")
    table = con.sql(f"SELECT * FROM {r.roads}").to_arrow_table()
    roads = Roads.of(table, name=r.roads).clip(r.synthesizer.bbox.as_list())
    r.synthesizer.roads = roads   # the request's own synthesizer (made for it by fit_request): a public input
    return replace(r, on_roads=roads)


def gathered_key(relation: str, temp_tables: list[str] | None) -> str:
    """The budget key of rows a macro gathered on the caller's connection: its temporary table's, or a refusal."""
    key = lineage.temp_table_key(str(relation), temp_tables)
    if key is None:
        raise DuckmobError(f"duckmob: {relation} is a CTE, a temporary view, a query over temporary tables or a "
                           "table not committed yet: duckmob cannot see from SQL which tables it reads, so it cannot "
                           "charge their budgets (COMMIT a new table first). "
                           "Release from a table, a committed view or a parenthesised query over them, from a "
                           "temporary table by its name, or call duckmob.synthesize(con, ...) from Python, which "
                           "reads through your own connection")
    return key


def _stable(prepared: Prepared, request: dict) -> dict:
    """``request`` with its stability checked against the relation's plan (refused, before anything is reserved,
    when the plan can fan rows out and none was declared: :func:`duckmob.source.lineage.check_stability`)."""
    declared = validators.stability(request.get("stability"))
    return {**request, "stability": lineage.check_stability(prepared.lineage, declared)}


def noisy_count(db: Database, con, relation: str, *, mapping: Mapping, caller_checked: bool = False,
                **request) -> float:
    """``mob_noisy_count`` of ``relation`` on ``con``: DuckDB counts after the reservation; an integer reaches
    Python. ``request``: eps, seed, privacy_unit, max_trajectories_per_user, what."""
    if not caller_checked:
        _committed_shadowed(con, relation)
    prepared = prepare(con, relation, mapping, home=home(db), shape="ids")
    request = _stable(prepared, request)

    def count(what: str, unit: PrivacyUnit) -> int:
        return int(con.sql(count_query(prepared.select, what=what, unit=unit)).fetchall()[0][0])

    key = _key("count", prepared.lineage.source, prepared.select, request,
               lambda: content_version(con, prepared.select))
    return _remembered(db, key, lambda: counting.noisy_count(
        db, source=prepared.lineage.source, user_col=mapping.user_col if prepared.has_user else None, count=count,
        **request))


def noisy_count_gathered(db: Database, relation: str, temp_tables, has_user: bool, mapping: Mapping, pairs,
                         **request) -> float:
    """``mob_noisy_count`` of rows gathered from the caller's temporary table; ``pairs()`` gives (traj_id,
    user_id) arrays (-1: NULL)."""
    def count(what: str, unit: PrivacyUnit) -> int:
        traj, user = pairs()
        return pair_count(traj, user, what=what, unit=unit)

    source = gathered_key(relation, temp_tables)
    key = _key("count", source, "", {**request, "mapping": mapping},
               lambda: table_version(pa.table(dict(zip(("traj_id", "user_id"), pairs())))))
    return _remembered(db, key, lambda: counting.noisy_count(
        db, source=source, user_col=mapping.user_col if has_user else None, count=count, **request))


def transitions(db: Database, con, relation: str, *, mapping: Mapping, caller_checked: bool = False, **request):
    """``mob_transitions`` of ``relation`` on ``con``, read after the reservation in record batches of whole
    sequences: ``(states, counts)`` as :func:`duckmob.release.transitions`."""
    if not caller_checked:
        _committed_shadowed(con, relation)
    prepared = prepare(con, relation, mapping, home=home(db), shape="sequences")
    request = _stable(prepared, request)
    unit = str(request.get("privacy_unit") or "trajectory").strip().lower()
    key = _key("transitions", prepared.lineage.source, prepared.select, request,
               lambda: content_version(con, prepared.select))
    return _remembered(db, key,
                       lambda: counting.transitions(db, source=prepared.lineage.source,
                                                    user_col=mapping.user_col if prepared.has_user else None,
                                                    load=lambda: (lambda: read_sequences(con, prepared.select, unit)),
                                                    **request))


def transitions_gathered(db: Database, relation: str, temp_tables, has_user: bool, mapping: Mapping, rows,
                         **request):
    """``mob_transitions`` of rows gathered from the caller's temporary table (``rows()``: a StructArray)."""
    source = gathered_key(relation, temp_tables)
    key = _key("transitions", source, "", {**request, "mapping": mapping},
               lambda: _rows_version(rows()))
    return _remembered(db, key,
                       lambda: counting.transitions(db, source=source, user_col=mapping.user_col if has_user else None,
                                                    load=lambda: sequence_arrays(grouped_sequences(rows())),
                                                    **request))


def _rows_version(rows: pa.StructArray | None) -> tuple[int, int]:
    return (0, 0) if rows is None else table_version(pa.Table.from_struct_array(rows))


def set_budget(db: Database, con, relation: str, eps, delta, *, temp_tables=None) -> dict:
    """Declare or raise the budget of the base table ``relation`` names (any spelling), resolved on ``con``. A view
    or query over several tables is refused (declare each table's); a view over files declares the budget of each
    file it reads (``file:/real/path``, which ``relation`` may also name itself); a view over other table functions
    declares its own; a name that no longer resolves keeps the budget already declared under it (a dropped table's
    ledger stays)."""
    key = lineage.temp_table_key(str(relation), temp_tables)
    if key is None and str(relation).startswith("file:"):   # a file's own budget key, as the refusals name it
        path = str(relation)[len("file:"):]
        if not os.path.isfile(path):
            raise DuckmobError(f"no such file: '{path}': mob_set_budget('file:/path/to/file', ...) declares the budget "
                               "of a file that releases read (through a view or a query over it)")
        key = lineage.file_key(path)
    if key is None:
        try:
            found = lineage.resolve(con, relation, home(db))
        except lineage.Unplannable:
            if read_ledger(db, lambda cur: ledger.budget(cur, relation)) is None:
                raise DuckmobError(f"no such table or view: '{relation}' (SHOW TABLES lists them); mob_set_budget "
                                   "declares the budget of the table that releases will read") from None
            found = lineage.Lineage(relation, (relation,))
        if found.own_key is not None:   # a view over table functions that are no files carries its own budget
            return declare(db, found.own_key, eps, delta)
        if len(found.keys) > 1 and all(k.startswith("file:") for k in found.keys):
            rows = [declare(db, k, eps, delta) for k in found.keys]   # every file the view reads, alike
            return min(rows, key=lambda row: row["remaining"])
        if len(found.keys) != 1:
            raise DuckmobError(f"duckmob: {relation} reads several tables ({', '.join(found.keys)}): a budget belongs "
                               "to one table; declare each one's with mob_set_budget('<table>', ...)")
        key = found.keys[0]
    return declare(db, key, eps, delta)


def gathered_pairs(rows):
    """(traj_id, user_id) arrays of gathered pair rows (NULL -> -1)."""
    if rows is None or len(rows) == rows.null_count:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = rows.filter(pc.is_valid(rows))
    return (np.asarray(rows.field("traj_id").fill_null(-1).to_numpy(zero_copy_only=False), np.int64),
            np.asarray(rows.field("user_id").fill_null(-1).to_numpy(zero_copy_only=False), np.int64))


__all__ = ["fit", "fit_gathered", "synthesize", "synthesize_gathered", "sample", "noisy_count", "noisy_count_gathered",
           "transitions", "transitions_gathered", "set_budget", "check_shadowing", "gathered_key", "home",
           "gathered_pairs"]
