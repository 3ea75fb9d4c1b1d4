{#- A path from the project's vars (density_png, report_html), relative to this project's folder unless it is
    absolute, so that the project runs from any working directory (dbt run --project-dir path/to/dbt_project ...). -#}
{% macro project_path(path) -%}
  {%- if path.startswith('/') or path[1:2] == ':' -%}
    {{ path }}
  {%- else -%}
    {{ invocation_args_dict.get('project_dir') or '.' }}/{{ path }}
  {%- endif -%}
{%- endmacro %}
