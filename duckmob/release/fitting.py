"""Fitting a method on a source: one release of the source's budget (``synthesize``, ``mob_fit``), and sampling a
fitted model (free post-processing)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from duckmob import validators
from duckmob.errors import DuckmobError
from duckmob.release import sampling
from duckmob.release.protocol import Release, Request, run
from duckmob.release.registry import Database
from duckmob.privacy import accounting, ledger
from duckmob.privacy.events import Event
from duckmob.privacy.noise import NoiseSource
from duckmob.privacy.unit import PrivacyUnit
from duckmob.source import PointSource
from duckmob import synth
from duckmob.synth import store
from duckmob.synth.base import Plan
from duckmob.trajectories import Trajectories


@dataclass(frozen=True)
class FitRequest:
    """The validated public arguments of a fit (synthesize or mob_fit)."""

    source: str
    eps: float
    delta: float
    method: str
    synthesizer: Any
    unit: PrivacyUnit
    params: dict
    seed: int | None
    name: str | None = None
    n: int | None = None
    max_rows: int = validators.MAX_ROWS
    stability: int | None = None   # the caller's public stability (None: 1, once the plan is checked stable)
    roads: str | None = None       # the name of a public road network the output is placed on
    on_roads: Any = None           # that network (duckmob.roads.Roads), read by the release core before the fit
    scatter_m: float | None = None  # a public GPS-like scatter (metres) added to the points placed on the roads


def _sql(kind: str, default=None):
    return field(default=default, metadata={"sql": kind})


@dataclass(frozen=True)
class FitArgs:
    """The public arguments of a fit (``synthesize``, ``mob_fit``) as the caller gave them, not yet validated: the
    one typed definition that the SQL request STRUCT (:meth:`sql_types`, duckmob/sql/synth.py), the Python API and
    :func:`fit_request` follow (tests/test_release_args.py checks the macros, :func:`duckmob.synthesize` and
    Spark's ``synthesize`` against it). :meth:`request` validates them for the input's budget key."""

    eps: Any = field(metadata={"sql": "DOUBLE"})   # required (NULL from SQL is refused by fit_request)
    delta: Any = _sql("DOUBLE")
    method: Any = _sql("VARCHAR", "privtrace")
    bbox: Any = _sql("DOUBLE[]")
    privacy_unit: Any = _sql("VARCHAR", "trajectory")
    max_trajectories_per_user: Any = _sql("BIGINT")
    params: Any = _sql("VARCHAR")
    outside: Any = _sql("VARCHAR", "drop")
    seed: Any = _sql("BIGINT")
    n: Any = _sql("BIGINT")
    max_rows: Any = _sql("BIGINT")
    name: Any = _sql("VARCHAR")
    stability: Any = _sql("BIGINT")
    roads: Any = _sql("VARCHAR")
    scatter_m: Any = _sql("DOUBLE")

    @classmethod
    def sql_types(cls) -> dict[str, str]:
        """Each argument's SQL type, in the order of the request STRUCT the macros build."""
        return {f.name: f.metadata["sql"] for f in fields(cls)}

    def request(self, source: str) -> FitRequest:
        """The validated :class:`FitRequest` on the budget key ``source`` (:func:`fit_request`)."""
        return fit_request(source=source, **{f.name: getattr(self, f.name) for f in fields(self)})


def fit_request(*, source, eps, delta=None, method="privtrace", bbox=None, privacy_unit="trajectory",
                max_trajectories_per_user=None, params=None, outside="drop", seed=None, name=None,
                n=None, max_rows=None, stability=None, roads=None, scatter_m=None) -> FitRequest:
    """Validate every public argument of a fit (before anything is reserved or read). ``stability``: see
    :func:`duckmob.source.lineage.check_stability`; s > 1 is refused for a method that is not pure Laplace."""
    source = validators.source_name(source)
    cls = synth.get(method)
    stability = validators.stability(stability)
    if stability is not None and stability > 1 and cls.needs_delta:
        raise DuckmobError(f"stability := {stability} needs a release made of Laplace mechanisms only (privtrace, "
                           f"mob_noisy_count, mob_transitions): {cls.method} {cls.mechanism or 'is not'}, whose cost "
                           "for s copies of one trajectory duckmob does not account. Release from a relation that "
                           "keeps one row one row (stability 1)")
    params = synth.parse_params(params)
    synthesizer = cls(bbox, **params)
    unit = validators.privacy_unit(privacy_unit, max_trajectories_per_user)
    validators.outside(outside)
    return FitRequest(source=source, eps=validators.epsilon(eps),
                      delta=validators.release_delta(delta, default=cls.default_delta, needs_delta=cls.needs_delta,
                                                     method=cls.method, mechanism=cls.mechanism),
                      method=cls.method, synthesizer=synthesizer, unit=unit, params=params,
                      seed=validators.seed(seed), name=None if name is None else validators.model_name(name),
                      n=validators.n_trajectories(n), max_rows=validators.max_rows(max_rows), stability=stability,
                      roads=None if roads is None else validators.source_name(roads),
                      scatter_m=validators.scatter_m(scatter_m, roads))


def fit(db: Database, request: FitRequest, source: PointSource):
    """Fit ``request.method`` on ``source``: one release of the budget of ``request.source`` (the ledger's name of
    the base tables the source reads, :mod:`duckmob.source.lineage`).

    ``source`` (:mod:`duckmob.source`: points in memory, a DuckDB relation read out of core, a Spark DataFrame) was
    checked on its schema before this call; it is read after the reservation, cleaned privately (invalid points,
    points outside the bbox and short trajectories dropped, per trajectory, silently) and, under the user unit,
    bounded to at most k trajectories per user, chosen at random. The same model under the same seed whichever
    backend reads it (tests/test_stream.py). Returns ``(model, ledger id, noise source)``; ``source`` is closed.
    """
    r = request
    synthesizer, noise = r.synthesizer, NoiseSource(r.seed)
    s = r.stability or 1
    recorded = {"method": r.method, "max_trajectories_per_user": r.unit.max_trajectories_per_user, **r.params,
                **({"model": r.name} if r.name else {}), **({"stability": s} if s > 1 else {}),
                **(roads_record(r) or {})}
    def price(prior: ledger.Prior) -> tuple[Event, Plan]:
        # Stability s (a fan-out relation declared by the caller): the mechanism runs at eps / s and is charged its
        # event grouped by s (every sensitivity times s), i.e. eps in all; the plan keeps the mechanism's own event
        plan = synthesizer.plan(r.eps / s, r.delta, r.unit, prior)
        event = accounting.grouped(plan.event, s)
        prior.check_asked(event, r.eps, r.delta)   # never more than the eps asked, at the budget's delta
        if r.n is not None:   # an output of a size given in public: refused here, before the reservation
            sampling.check_rows(r.n, plan.max_points, r.max_rows)
        return event, plan

    def compute(release: Release):
        plan: Plan = release.plan   # the plan the reservation paid for
        batches = release.read(lambda: source.batches(bbox=plan.bbox, time_required=plan.needs_time,
                                                      unit=r.unit, rng=noise.generator))
        try:
            release.check_interrupt()
            return synthesizer.fit(batches, plan, release)
        finally:
            batches.close()

    req = Request(source=r.source, mechanism=r.method, privacy_unit=r.unit.kind, params=recorded,
                  seeded=noise.seeded, price=price)
    try:
        if r.name is None:
            model, ledger_id = run(db, req, compute, noise)
            return model, ledger_id, noise
        claim_name(db, r.name)   # before anything is reserved; a second fit of the same name is refused here
        try:
            model, ledger_id = run(db, req, compute, noise)
            _store(db, r, model, ledger_id)
        finally:   # stored, or nothing stored: the name is no longer being fitted
            db.pending_names.discard(r.name)
        return model, ledger_id, noise
    finally:
        source.close()


def roads_record(r: FitRequest) -> dict | None:
    """What a release records of the public road network it used (ledger params, stored model): its name, the
    digest of its rows (:attr:`duckmob.roads.Roads.digest`) and the scatter asked; None without roads."""
    if r.on_roads is None:
        return None
    return {"roads": r.roads, "roads_digest": r.on_roads.digest, "roads_bbox": r.synthesizer.bbox.as_list(),
            **({"roads_scatter_m": r.scatter_m} if r.scatter_m else {})}


def with_network(r: FitRequest, table, name: str) -> FitRequest:
    """``r`` with the public road network ``table`` (segments, read by the caller before anything is reserved and
    checked public) clipped to its bbox, handed to its synthesizer and recorded under ``name``."""
    from duckmob.roads import Roads

    network = Roads.of(table, name=name).clip(r.synthesizer.bbox.as_list())
    r.synthesizer.roads = network   # the request's own synthesizer (made for it by fit_request): a public input
    return replace(r, roads=name, on_roads=network)


def on_roads(model, roads, bbox, scatter_m: float | None = None):
    """``model`` whose samples are placed on ``roads`` inside ``bbox`` (:class:`duckmob.synth.onroads.OnRoads`),
    scattered by ``scatter_m`` metres, or ``model``."""
    if roads is None:
        return model
    from duckmob.synth.onroads import OnRoads

    return OnRoads(model, roads, bbox, scatter_m)


def claim_name(db: Database, name: str) -> None:
    """Claim a model name for one fit (refused when stored or being fitted); release it with
    ``db.pending_names.discard(name)`` once the fit is over."""
    with db.lock, db.connection() as cur:
        taken = name in db.pending_names or store.exists(cur, name)
        if not taken:
            db.pending_names.add(name)
    if taken:
        raise DuckmobError(f"a model named '{name}' already exists or is being fitted: choose another name, or "
                           f"delete it first with DELETE FROM {store.TABLE} WHERE name = '{name}'")


def _store(db: Database, r: FitRequest, model, ledger_id: int) -> None:
    """Save a fitted model bound to its ledger row (the row records the model's checksum)."""
    blob = model.to_bytes()
    described = {**model.describe(), "privacy_unit": r.unit.kind,
                 "max_trajectories_per_user": r.unit.max_trajectories_per_user,
                 "seeded": r.seed is not None, **(roads_record(r) or {})}
    digest = store.checksum(r.name, r.method, r.source, described, blob, ledger_id)
    with db.lock:
        with db.connection() as cur:
            ledger.update(cur, ledger_id, params={"model_checksum": digest}, verified=db.verified)
            store.save(cur, r.name, r.method, r.source, described, r.eps, r.delta, blob, ledger_id=ledger_id,
                       checksum=digest)


# A Laplace count lies within ln(20) of its scales of the true count with probability 95%.
LAPLACE_95 = math.log(20)


def default_size(model) -> int:
    """The number of trajectories a sample draws when no n is given: the model's noisy trajectory count.

    Refused when that count is mostly noise, which its released value and public Laplace scale tell alone
    (post-processing, free): below twice its 95% margin, where a relative error of 50% or more is to be expected.
    Sizing an output from such a count gave tables many times the real one (30 trajectories at eps 1 gave 119;
    the user unit with k = 50 at eps 0.3 gave 28,951 from 1,999)."""
    count = model.size_count
    if count is not None:
        margin = count["scale"] * LAPLACE_95
        if count["value"] < 2 * margin:
            unit = f" under the user unit (k = {count['k']})" if count["k"] > 1 else ""
            raise DuckmobError(
                f"the trajectory count released at eps {count['eps']:.3g} is {count['value']:,} ± {margin:,.0f} (95%):"
                f" mostly noise, so it cannot size the output. This table is too small for this eps{unit}, or few "
                "of its trajectories lie inside the bbox (check the bbox on your side with FROM mob_check('<table>', "
                "bbox := [...]): exact counts, not private): pass n := <number of trajectories> (a public choice), "
                "or raise eps. (A release's spend stands; to sample again without spending, fit once with mob_fit "
                "and draw with mob_sample('name', n := ...).)")
    n = model.default_n
    if n is None or n < 1:
        raise DuckmobError("this model has no default size (its noisy trajectory count is below 1): pass "
                           "n := number of trajectories")
    return n


def output(model, n: int | None, seed: np.random.SeedSequence, max_rows: int | None = None, *,
           desc: str = "output", threads: int = 1, on_first=None) -> sampling.Output:
    """The output of ``n`` trajectories of a fitted model (None: :func:`default_size`) under ``seed``: free
    post-processing, drawn block by block as it is read (:mod:`duckmob.release.sampling`). Refused before any row is
    drawn when it could have more than ``max_rows`` rows (None: :data:`duckmob.validators.MAX_ROWS`):
    :func:`~duckmob.release.sampling.check_rows` on ``n`` and the model's public ``max_points``. ``threads``: how
    many blocks may be drawn at once (:class:`~duckmob.release.sampling.Output`; the rows do not depend on it)."""
    given = n is not None
    n = validators.n_trajectories(default_size(model) if n is None else n)
    sampling.check_rows(n, model.max_points, validators.max_rows(max_rows), after_fit=not given)
    return sampling.Output(model, n, seed, desc=desc, threads=threads, on_first=on_first)


def sample(model, n: int | None, seed: np.random.SeedSequence, max_rows: int | None = None) -> Trajectories:
    """``n`` trajectories of a fitted model (None: :func:`default_size`), all at once (memory: the whole output;
    :func:`output` streams). ``seed``: the output's SeedSequence (:meth:`NoiseSource.output_seed`)."""
    return output(model, n, seed, max_rows).trajectories()
