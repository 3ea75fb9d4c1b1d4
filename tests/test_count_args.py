"""The public arguments of the counting releases have one typed definition each (duckmob.release.CountArgs,
TransitionArgs), as a fit's have (FitArgs, tests/test_release_args.py): the SQL macros, the request STRUCT their
UDFs receive and the Python API are checked against it here, and a value is checked once, when the arguments are
made, before any input is resolved."""

from __future__ import annotations

import dataclasses
import inspect

import duckdb
import pytest

from duckmob import api
from duckmob.errors import DuckmobError
from duckmob.privacy.unit import PrivacyUnit
from duckmob.release import CountArgs, TransitionArgs
from duckmob.sql import privacy as sql_privacy

KINDS = [(CountArgs, "mob_noisy_count", sql_privacy.NOISY_COUNT, api.noisy_count, {"traj_col", "user_col"}),
         (TransitionArgs, "mob_transitions", sql_privacy.TRANSITIONS, api.transitions,
          {"traj_col", "user_col", "cells_col"})]
IDS = ["noisy_count", "transitions"]


def _public(kind) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(kind) if f.init]


def _keywords(fn) -> dict:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind == p.KEYWORD_ONLY}


@pytest.mark.parametrize("kind, macro, struct, python, mapping", KINDS, ids=IDS)
def test_the_udf_receives_the_arguments_in_their_order(kind, macro, struct, python, mapping):
    keys = list(struct.fields)
    assert keys[:4] == ["source", "out_of_core", "types", "mapping"]
    assert keys[4:] == [f.name for f in _public(kind)]
    assert {k: struct.fields[k] for k in keys[4:]} == {f.name: f.metadata["sql"] for f in _public(kind)}


@pytest.mark.parametrize("kind, macro, struct, python, mapping", KINDS, ids=IDS)
def test_the_macro_takes_the_arguments(con, kind, macro, struct, python, mapping):
    (params,), = con.sql(f"SELECT parameters FROM duckdb_functions() WHERE function_name = '{macro}'").fetchall()
    assert params[0] == "tbl"
    assert set(params[1:]) == mapping | set(kind.macro_names().values())


@pytest.mark.parametrize("kind, macro, struct, python, mapping", KINDS, ids=IDS)
def test_the_python_api_takes_the_arguments_with_the_same_defaults(kind, macro, struct, python, mapping):
    given = _keywords(python)
    for name in mapping:
        given.pop(name)
    required = {"eps", "n_states"}   # the dataclass gives them a None default only to follow `order`; refused
    assert given == {f.name: inspect.Parameter.empty if f.name in required else f.default for f in _public(kind)}


def test_the_arguments_are_validated_when_made():
    args = CountArgs(eps="0.5", seed=3.0, privacy_unit=" USER ", max_trajectories_per_user=4.0, what=None)
    assert (args.eps, args.seed, args.privacy_unit, args.max_trajectories_per_user, args.what) == \
        (0.5, 3, "user", 4, "trajectories")
    assert args.unit == PrivacyUnit.user(4) and args.sensitivity == 4
    users = CountArgs(eps=1, privacy_unit="user", what="users")   # users need no bound: sensitivity 1
    assert users.unit == PrivacyUnit.user(1) and users.sensitivity == 1 and users.max_trajectories_per_user == 1
    t = TransitionArgs(order=None, eps=1, n_states=9.0, support="neighbours", w=3.0, max_length=5)
    assert (t.order, t.n_states, t.w, t.max_length, t.unit) == (1, 9, 3, 5, PrivacyUnit.trajectory())
    # replaced (the input's stability), still valid; a bad replacement is refused the same way
    assert dataclasses.replace(t, stability=2).stability == 2 and dataclasses.replace(args, stability=None) == args
    with pytest.raises(DuckmobError, match="stability must be an integer of at least 1"):
        dataclasses.replace(args, stability=0)


@pytest.mark.parametrize("make, message", [
    (lambda: CountArgs(eps=None), "eps is required"),
    (lambda: CountArgs(eps=0), "eps must be a positive number"),
    (lambda: CountArgs(eps=1, what="points"), "what must be 'trajectories' or 'users'; got 'points'"),
    (lambda: CountArgs(eps=1, privacy_unit="user"), "privacy_unit := 'user' needs a contribution bound"),
    (lambda: CountArgs(eps=1, seed=-1), "seed must be a non-negative integer"),
    (lambda: TransitionArgs(eps=1), "n_states is required"),
    (lambda: TransitionArgs(eps=1, n_states=9, order=3), "markov_order must be 1 or 2; got 3"),
    (lambda: TransitionArgs(eps=1, n_states=9, max_length=0), "max_length must be an integer of at least 1"),
    (lambda: TransitionArgs(eps=1, n_states=9, support="near"), "support must be NULL, 'full' or 'neighbours'"),
    (lambda: TransitionArgs(eps=1, n_states=9, support="neighbours", w=4),
     r"support := 'neighbours' needs the grid width w with w \* w = n_states \(9\); got w = 4"),
    (lambda: TransitionArgs(eps=1, n_states=1024, order=2), "a dense order-2 table over 1024 states is too large"),
])
def test_a_bad_argument_is_refused_in_one_line(make, message):
    with pytest.raises(DuckmobError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


def test_sql_and_python_refuse_a_bad_argument_alike_and_before_the_table_is_resolved(con):
    """The same one-line refusal from the macro and from Python; Python checks the arguments before it resolves the
    table (a missing one is not what the caller hears about first); nothing is recorded."""
    con.execute("CREATE TABLE seqs AS SELECT 1 AS traj_id, 1 AS user_id, [0, 1] AS cells")
    cases = [("FROM mob_noisy_count('seqs', eps := -1)", lambda table: api.noisy_count(con, table, eps=-1.0),
              "eps must be a positive number, got -1.0"),
             ("FROM mob_transitions('seqs', eps := 1, n_states := 9, markov_order := 3)",
              lambda table: api.transitions(con, table, eps=1, n_states=9, order=3), "markov_order must be 1 or 2")]
    for sql, python, message in cases:
        with pytest.raises(duckdb.Error) as by_sql:
            con.sql(sql).fetchall()
        for table in ("seqs", "nowhere"):
            with pytest.raises(DuckmobError, match=message) as by_python:
                python(table)
            assert str(by_python.value) in str(by_sql.value)
    assert con.sql("FROM mob_ledger()").fetchall() == []
