"""SQL layer for the release report: ``mob_report`` (macro in report.sql) gathers the synthetic table's points
(and the real table's only when ``real :=`` names one) and calls one UDF, which builds and writes the page
(:func:`duckmob.report.build`) and returns one row per section."""

from __future__ import annotations

import pyarrow as pa

from duckmob.sql.udf import POINTS_TYPE, Request, Udf, one_row, points

REPORT = Request(path="VARCHAR", synth="VARCHAR", real="VARCHAR", bbox="DOUBLE[]", release="BIGINT")
ROW_TYPE = "STRUCT(section VARCHAR, summary VARCHAR, path VARCHAR)[]"


def setup(con) -> None:
    """Nothing to create: the output records are written by the releases (duckmob.release.outputs)."""


def udfs(db) -> list[Udf]:
    def report(synth, real, request):
        from duckmob.report import build

        r = REPORT.parse(request, "_mob_report")
        done = build(db, points(synth), real_points=None if r["real"] is None else points(real), bbox=r["bbox"],
                     release=r["release"], path=r["path"], synth_name=r["synth"], real_name=r["real"])
        rows = done.rows()
        return one_row(pa.table({"section": [s for s, _ in rows], "summary": [t for _, t in rows],
                                 "path": [done.path] * len(rows)}))

    return [Udf("_mob_report", report, [POINTS_TYPE, POINTS_TYPE], ROW_TYPE, REPORT, side_effects=True,
                special_nulls=True)]
