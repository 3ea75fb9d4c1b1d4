"""SQL layer for the evaluation: hidden UDFs behind the table macros in evaluate.sql.

Every macro gathers each table's points through ``mob_points`` into one LIST(STRUCT) and calls one UDF here,
which returns rows as LIST(STRUCT). Options travel as one JSON object (NULL = the default).
"""

from __future__ import annotations

import json

import pyarrow as pa

from duckmob.sql import POINTS_TYPE, Udf, one_row, points, scalar

METRIC_ROW = ("STRUCT(metric VARCHAR, value DOUBLE, lower_is_better BOOLEAN, source VARCHAR, "
              "description VARCHAR)[]")


def _options(arg) -> dict:
    text = scalar(arg)
    return {k: v for k, v in json.loads(text).items() if v is not None} if text else {}


def _rows(rows: list[dict]) -> pa.ListArray:
    from duckmob.evaluate import to_table

    return one_row(to_table(rows))


def _evaluate(real, synth, bbox, options):
    from duckmob.evaluate import evaluate

    return _rows(evaluate(points(real), points(synth), scalar(bbox), **_options(options)))


def udfs(con) -> list[Udf]:
    return [
        Udf("_mob_evaluate", _evaluate, [POINTS_TYPE, POINTS_TYPE, "DOUBLE[]", "VARCHAR"], METRIC_ROW,
            special_nulls=True),
    ]
