"""Releases of DuckDB relations: the one assembly that SQL and the Python API call.

Each release (fit, synthesize, noisy count, transitions) is written once against its input
(:class:`~duckmob.release.inputs.Input`): a relation read out of core on a connection, or rows a SQL macro
gathered, chosen by the caller and checked when it is made, before anything is reserved (the caller's catalog for
shadowing temporary objects, the relation's lineage and column types, :mod:`duckmob.release.inputs`). A release
then validates its public arguments; only then does the release core reserve the budget of every base table the
input reads, and read the rows (TRY_CAST: a value that cannot be converted drops its point). A release closes its
input when it is over.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace

import numpy as np
import pyarrow.compute as pc

from duckmob import validators
from duckmob.errors import DuckmobError
from duckmob.privacy import ledger
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit, no_user_column
from duckmob.release import counting, fitting, outputs, sampling
from duckmob.release.inputs import Gathered, Input, Relation, check_shadowing, gathered_key, home
from duckmob.release.protocol import read_ledger, set_budget as declare
from duckmob.release.registry import Database
from duckmob.source import lineage
from duckmob.source.table import TableSource, content_version
from duckmob.synth import store


def _needs_user_column(has_user: bool, unit: PrivacyUnit, relation: str) -> None:
    if unit.is_user and not has_user:
        raise no_user_column(f"'{relation}'")


def _fit_request(db: Database, inp: Input, args: fitting.FitArgs) -> fitting.FitRequest:
    """The checks of a fit that read no row: the public arguments, the stability the input's plan allows, the
    public roads, the user column the user unit needs."""
    r = args.request(inp.source)
    r = replace(r, stability=inp.stable(r.stability))
    if r.roads is not None:
        with inp.roads_connection(db) as con:
            r = with_roads(db, con, r, inp.sensitive)
        r = replace(r, on_roads=_kept(db, r.on_roads))
        # the fit matches fixes on the kept network too (same digest, same rows), whose snapping tables exist
        r.synthesizer.roads = r.on_roads
    _needs_user_column(inp.has_user, r.unit, inp.relation)
    return r


def fit(db: Database, inp: Input, args: fitting.FitArgs):
    """Fit a method on ``inp`` with the public arguments ``args`` (one release): ``(model, ledger id, noise,
    FitRequest)``."""
    try:
        r = _fit_request(db, inp, args)
        model, ledger_id, noise = fitting.fit(db, r, inp.points())
        return model, ledger_id, noise, r
    finally:
        inp.close()


def synthesize(db: Database, inp: Input, args: fitting.FitArgs) -> sampling.Output:
    """Fit on ``inp`` with the public arguments ``args`` and open the output (``synthesize``): the synthetic table's
    :class:`~duckmob.release.sampling.Output`, drawn block by block as it is read. The same request again within a
    few minutes (a lazy DuckDB relation printed, then fetched) gets the same model and output seed back, so the same
    rows, charged once (:class:`Recent`). The size check (:func:`fitting.output`) runs before any row is drawn; with
    an explicit n it ran before the reservation too (:func:`fitting.fit`)."""
    try:
        r = _fit_request(db, inp, args)
        key = _key("synthesize", inp, {**asdict(args), **(fitting.roads_record(r) or {})}, versioned=False)
        kept = None if key is None else db.recent.get(key)   # kept beside the version of the rows it read
        version = None if kept is None else _version(inp, kept[0][0])   # a first request scans nothing for it
        hit = kept[1] if kept is not None and kept[0] == version and _verified(db) else None
        if hit is None:
            model, ledger_id, noise, version = _fit_versioned(db, r, inp, key is not None, version)
            seed = noise.output_seed()
            if version is not None:   # its model and output seed (a SeedSequence of its NoiseSource): the same rows
                db.recent.put(key, (version, (model, seed, ledger_id)))
        else:
            model, seed, ledger_id = hit
    finally:
        inp.close()
    return fitting.output(fitting.on_roads(model, r.on_roads, r.synthesizer.bbox.as_list(), r.scatter_m), r.n, seed, r.max_rows, desc=f"synthesize {r.method}",
                          threads=draw_threads(db),
                          on_first=outputs.recorder(db, ledger_id, model, bbox=r.synthesizer.bbox))


def _verified(db: Database) -> bool:
    """True once the ledger is checked intact (a ledger rewritten since a kept release is reported, as any release
    would report it)."""
    with db.lock, db.connection() as cur:
        ledger.verify(cur, db.verified)
    return True


def _version(inp: Input, where: str | None) -> tuple:
    """``(where, content version)`` of the rows ``inp`` gives now: a relation's rows that pass ``where`` (the point
    filter its kept release read through), or gathered rows' (``where`` None: all of them)."""
    if where is None or not isinstance(inp, Relation):
        return None, tuple(inp.version())
    return where, tuple(content_version(inp.con, inp.select, where))


def _fit_versioned(db: Database, r: fitting.FitRequest, inp: Input, versioned: bool, version=None):
    """:func:`fitting.fit` on ``inp``'s points, and the version of the rows it read (:func:`_version`) when
    ``versioned`` (else None): a relation's computed by the fit's own scan over the rows it keeps
    (``TableSource.track_version``: no second scan; the release is a function of those rows alone, so rows its
    point filter drops need no version); gathered rows' in memory before the fit (``version``, when the caller has
    it already)."""
    if versioned and (version is None or version[0] is not None) and not isinstance(inp, Relation):
        version = _version(inp, None)
    points = inp.points()
    scanned = versioned and isinstance(points, TableSource)
    if scanned:
        points.track_version()
    model, ledger_id, noise = fitting.fit(db, r, points)
    if scanned:
        return model, ledger_id, noise, (points.where, tuple(points.version)) if points.version else None
    return model, ledger_id, noise, version if versioned else None


def cache_on() -> bool:
    """Whether a repeated request may get its earlier release again (:class:`Recent`); the environment variable
    ``DUCKMOB_RELEASE_CACHE=off`` turns it off: every request is then a new release, charged."""
    return os.environ.get("DUCKMOB_RELEASE_CACHE", "on").strip().lower() not in ("off", "0", "false", "no")


def _key(kind: str, inp: Input, request: dict, versioned: bool = True) -> str | None:
    """A request's identity for :class:`Recent`, or None when the cache is off: everything that determines the
    release. The database is the :class:`Database` that keeps the cache; ``inp.source`` names the resolved base
    tables (their budget keys); ``inp.select`` is what is read from them, with its column mapping (empty for rows
    gathered from a temporary table, whose mapping is ``inp.identity``'s); ``request`` holds the unit, every public
    parameter and the seed; ``inp.version()`` is the content version of the rows the release would read
    (:func:`~duckmob.source.table.content_version`, which changes on any write: a DROP and CREATE, an INSERT, a
    DELETE, an UPDATE, another connection's temporary table of the same name with other rows). Anything else makes
    a new release, charged. Without ``versioned`` the version is left out, for a caller that keeps it beside the
    result (``synthesize``: one kept release per request, compared with the rows' version only when there is one)."""
    if not cache_on():
        return None
    return json.dumps([kind, inp.source, inp.select, {**request, **inp.identity}] +
                      ([list(inp.version())] if versioned else []), sort_keys=True, default=str)


def sample(db: Database, name, n=None, seed=None, max_rows=None) -> sampling.Output:
    """The output of ``mob_sample``: ``n`` trajectories (None: the model's noisy count) of the stored model
    ``name`` under ``seed`` (None: OS entropy). Reads no data and spends nothing; refused before any row is drawn
    when it could have more than ``max_rows`` rows."""
    name = validators.model_name(name)
    n, seed, max_rows = validators.n_trajectories(n), validators.seed(seed), validators.max_rows(max_rows)
    model = _stored_model(db, name)
    described = read_ledger(db, lambda cur: store.described(cur, name))
    ledger_id = read_ledger(db, lambda cur: outputs.model_ledger_id(cur, name))
    return fitting.output(fitting.on_roads(model, _stored_roads(db, name, described),
                                           described.get("roads_bbox"), described.get("roads_scatter_m")), n,
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
    return _kept(db, found)


def _kept(db: Database, roads):
    """``roads``, or the network of the same digest an earlier output on this database kept (with its cut, graph
    and junction table already built): the same rows, so the same output."""
    kept = db.networks.get(roads.digest)
    if kept is None:
        db.networks.put(roads.digest, roads)
        return roads
    return kept


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


def with_roads(db: Database, con, r: fitting.FitRequest, sensitive: tuple[str, ...]) -> fitting.FitRequest:
    """``r`` with its public road network read (``roads := 'table'``, on ``con``, clipped to the bbox), before
    anything is reserved: a public input costs no budget. Refused when the roads' lineage reads one of the tables
    the release reads (``sensitive``) or any table with a declared privacy budget: a network built from the
    sensitive traces is not public (which streets people use is what the release protects)."""
    if r.roads is None:
        return r
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
    return fitting.with_network(r, con.sql(f"SELECT * FROM {r.roads}").to_arrow_table(), r.roads)


def noisy_count(db: Database, inp: Input, args: counting.CountArgs) -> float:
    """``mob_noisy_count`` of ``inp`` with the public arguments ``args``: counted after the reservation (by DuckDB
    out of core: an integer reaches Python)."""
    try:
        args = replace(args, stability=inp.stable(args.stability))
        return _remembered(db, _key("count", inp, asdict(args)), lambda: counting.noisy_count(
            db, args, source=inp.source, user_col=inp.user_col, count=inp.count))
    finally:
        inp.close()


def transitions(db: Database, inp: Input, args: counting.TransitionArgs):
    """``mob_transitions`` of ``inp`` with the public arguments ``args`` (read after the reservation, out of core in
    record batches of whole sequences): ``(states, counts)`` as :func:`duckmob.release.transitions`."""
    try:
        args = replace(args, stability=inp.stable(args.stability))
        return _remembered(db, _key("transitions", inp, asdict(args)), lambda: counting.transitions(
            db, args, source=inp.source, user_col=inp.user_col, load=inp.sequences(args.privacy_unit)))
    finally:
        inp.close()


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


__all__ = ["fit", "synthesize", "sample", "noisy_count", "transitions", "set_budget", "Input", "Relation",
           "Gathered", "check_shadowing", "gathered_key", "home", "gathered_pairs"]
