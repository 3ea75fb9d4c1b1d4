-- A differentially private synthetic trajectory table: one release of synth_eps from the budget of trips.
-- The pre-hook declares that budget (re-declaring the same one is harmless; the ledger keeps what was spent).
-- The post-hook writes the release report, the publishable page (docs/report.md): built from the release and this
-- table alone, it never reads trips. Hook text is rendered when the hook runs, so ref() there names the real
-- table and `this` the table just built. With the var roads (a model of public road segments, e.g.
-- `from mob_roads_from_osm('city.osm.pbf', bbox := ...)`) every synthetic point lies on those roads (docs/roads.md).
{{ config(pre_hook="from mob_set_budget('{{ ref(\"trips\") }}', eps := {{ var('budget_eps') }}, "
                   "delta := {{ var('budget_delta') }})",
          post_hook="from mob_report('{{ this }}', path := '{{ project_path(var(\"report_html\")) }}')") }}
{%- set seed = var('synth_seed', none) %}
{%- set roads = var('roads', none) %}

from synthesize('{{ ref("trips") }}',
                eps := {{ var('synth_eps') }},
                method := '{{ var("synth_method") }}',
                bbox := {{ var('bbox') }},
                outside := 'drop',
                roads := {{ 'NULL' if roads is none else "'" ~ ref(roads) ~ "'" }},
                seed := {{ 'NULL' if seed is none else seed }})
