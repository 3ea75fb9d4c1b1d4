-- How close the synthetic table is to the real one (PrivTrace's and HRNet's metrics; lower is better where
-- lower_is_better). NOT private: it reads trips exactly, for the data owner. The post-hook draws both density maps.
{{ config(post_hook="from mob_plot_density('{{ ref(\"trips\") }}', '{{ ref(\"synthetic_trips\") }}', "
                    "path := '{{ project_path(var(\"density_png\")) }}', bbox := {{ var('bbox') }}, w := 32)") }}

from mob_evaluate('{{ ref("trips") }}', '{{ ref("synthetic_trips") }}',
                  bbox := {{ var('bbox') }}, families := ['privtrace', 'hrnet'])
