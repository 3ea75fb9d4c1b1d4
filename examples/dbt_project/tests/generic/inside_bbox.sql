{#- Every point of the model lies inside the project's public bounding box (var bbox: [min_lat, min_lon, max_lat,
    max_lon]). Failing rows: the points outside it. -#}
{% test inside_bbox(model, lat_column='lat', lon_column='lon') %}
{%- set bbox = var('bbox') %}
select *
from {{ model }}
where not ({{ lat_column }} between {{ bbox[0] }} and {{ bbox[2] }}
           and {{ lon_column }} between {{ bbox[1] }} and {{ bbox[3] }})
{% endtest %}
