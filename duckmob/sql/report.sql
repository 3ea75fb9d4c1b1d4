-- The release report (duckmob/report): one self-contained HTML page per release, written to path; one row per
-- section with its one-line summary. Without real := the page is the publishable one and the real table is never
-- named in a query (the second argument gathers no row: the synthetic table cut to LIMIT 0). With real := it adds the
-- comparison with the real table under a do-not-publish banner. release := a ledger id (NULL: the release that
-- made synth, else the last synthesis, named as a guess on the page); bbox := NULL: the one the release recorded.
CREATE OR REPLACE TEMP MACRO mob_report(synth, path := 'report.html', real := NULL, bbox := NULL,
                                       release := NULL) AS TABLE
SELECT unnest(_mob_report(_mob_eval_points(synth),
                          _mob_eval_points(coalesce(real, '(SELECT * FROM ' || synth || ' LIMIT 0)')),
    {'path': path, 'synth': synth, 'real': real, 'bbox': bbox, 'release': release}), recursive := true);
