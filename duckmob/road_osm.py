"""OpenStreetMap extracts read into a roads table (:mod:`duckmob.roads`' shape): the reader behind
``mob_roads_from_osm`` (:mod:`duckmob.sql.roads`).

``.osm`` XML (also ``.osm.gz``, ``.osm.bz2``) is read with the standard library; ``.osm.pbf`` with the optional
pyosmium (``pip install 'duckmob[roads]'``). The ways kept are those whose ``highway`` tag is in a public list of
classes (:data:`DRIVABLE` unless the caller names another): an OSM extract is public geography, never derived from
the sensitive table, so errors here quote paths and tags exactly.
"""

from __future__ import annotations

import bz2
import gzip
import os
import xml.etree.ElementTree as ET

import numpy as np
import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.grid import BBox

# The OpenStreetMap highway classes a car can drive on: the public list the OSM loader keeps.
DRIVABLE = ("motorway", "motorway_link", "trunk", "trunk_link", "primary", "primary_link", "secondary",
            "secondary_link", "tertiary", "tertiary_link", "unclassified", "residential", "service", "living_street")


def read_osm(path: str, bbox=None, classes=None) -> pa.Table:
    """Read the ways of an OpenStreetMap extract whose ``highway`` tag is one of ``classes`` (a non-empty list of
    names; None: :data:`DRIVABLE`; ways tagged ``area=yes`` are squares, not streets, and are skipped) into a roads
    table ``lat1, lon1, lat2, lon2, highway``: one row per consecutive pair of a way's nodes, in file order. With
    ``bbox``, the segments with an endpoint inside it (as :meth:`Roads.clip`). ``.osm`` XML (also ``.osm.gz``,
    ``.osm.bz2``) is read with the standard library; ``.osm.pbf`` needs the optional ``osmium`` package
    (``pip install 'duckmob[roads]'``). A node a way names but the extract lacks drops its two segments."""
    if not os.path.isfile(path):
        raise DuckmobError(f"mob_roads_from_osm: no file at {path!r}; give the path of an .osm or .osm.pbf extract")
    classes = DRIVABLE if classes is None else classes
    if isinstance(classes, str) or not classes or not all(isinstance(c, str) and c.strip() for c in classes):
        raise DuckmobError("mob_roads_from_osm: classes must be a non-empty list of OpenStreetMap highway values, "
                           "such as ['primary', 'residential', 'footway']; leave it out for the drivable ways")
    keep = frozenset(classes)
    lower = path.lower()
    if lower.endswith(".pbf"):
        way_class, offsets, lat, lon = _ways_pbf(path, keep)
    elif lower.endswith((".osm", ".xml", ".osm.gz", ".osm.bz2")):
        way_class, offsets, lat, lon = _ways_xml(path, keep)
    else:
        raise DuckmobError(f"mob_roads_from_osm: {os.path.basename(path)!r} is not an OpenStreetMap extract; give "
                           ".osm, .osm.gz, .osm.bz2 (XML) or .osm.pbf")
    counts = np.diff(offsets)
    nxt = np.ones(len(lat), bool)
    nxt[offsets[1:][counts > 0] - 1] = False                      # a way's last node starts no segment
    i = np.flatnonzero(nxt)
    ok = np.isfinite(lat[i]) & np.isfinite(lat[i + 1])
    i = i[ok]
    way = np.repeat(np.arange(len(counts)), counts)[i]
    table = pa.table({"lat1": lat[i], "lon1": lon[i], "lat2": lat[i + 1], "lon2": lon[i + 1],
                      "highway": pa.array([way_class[w] for w in way], pa.string())})
    if bbox is not None:
        box = BBox.of(bbox)
        inside = box.contains(lat[i], lon[i]) | box.contains(lat[i + 1], lon[i + 1])
        table = table.filter(pa.array(inside))
    return table


def _open(path):
    lower = path.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _ways_xml(path, keep):
    """Kept ways of an OSM XML file: (class per way, node offsets, node lat, node lon; NaN for a missing node)."""
    node_ids, node_lat, node_lon = [], [], []
    way_class, refs, offsets = [], [], [0]
    try:
        with _open(path) as f:
            for _event, el in ET.iterparse(f, events=("end",)):
                if el.tag == "node":
                    node_ids.append(int(el.get("id")))
                    node_lat.append(float(el.get("lat", "nan")))
                    node_lon.append(float(el.get("lon", "nan")))
                    el.clear()
                elif el.tag == "way":
                    tags = {t.get("k"): t.get("v") for t in el.iter("tag")}
                    if tags.get("highway") in keep and tags.get("area") != "yes":
                        way_refs = [int(nd.get("ref")) for nd in el.iter("nd")]
                        way_class.append(tags["highway"])
                        refs.extend(way_refs)
                        offsets.append(len(refs))
                    el.clear()
                elif el.tag == "relation":
                    el.clear()
    except (ET.ParseError, OSError, EOFError, ValueError, TypeError) as e:
        raise DuckmobError(f"mob_roads_from_osm: {os.path.basename(path)!r} is not readable OSM XML ({e}); give "
                           "an .osm extract (from openstreetmap.org's export, Overpass or osmium)") from None
    ids = np.asarray(node_ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    lat_sorted = np.asarray(node_lat, dtype=np.float64)[order]
    lon_sorted = np.asarray(node_lon, dtype=np.float64)[order]
    r = np.asarray(refs, dtype=np.int64)
    pos = np.minimum(np.searchsorted(ids, r), max(len(ids) - 1, 0))
    found = (ids[pos] == r) if len(ids) else np.zeros(len(r), bool)
    lat = np.where(found, lat_sorted[pos] if len(ids) else np.nan, np.nan)
    lon = np.where(found, lon_sorted[pos] if len(ids) else np.nan, np.nan)
    return way_class, np.asarray(offsets, dtype=np.int64), lat, lon


def _ways_pbf(path, keep):
    """Kept ways of an .osm.pbf file, read with pyosmium (node locations resolved from the same file)."""
    try:
        import osmium
    except ImportError:
        raise DuckmobError("mob_roads_from_osm: reading .osm.pbf needs the osmium package: pip install "
                           "'duckmob[roads]' (or convert the extract to .osm XML)") from None
    way_class, lat, lon, offsets = [], [], [], [0]
    try:
        for obj in osmium.FileProcessor(path).with_locations():
            if not obj.is_way():
                continue
            cls = obj.tags.get("highway")
            if cls not in keep or obj.tags.get("area") == "yes":
                continue
            for nd in obj.nodes:
                ok = nd.location.valid()
                lat.append(nd.location.lat if ok else np.nan)
                lon.append(nd.location.lon if ok else np.nan)
            way_class.append(cls)
            offsets.append(len(lat))
    except RuntimeError as e:
        raise DuckmobError(f"mob_roads_from_osm: {os.path.basename(path)!r} is not a readable .osm.pbf ({e})") \
            from None
    return way_class, np.asarray(offsets, dtype=np.int64), np.asarray(lat, float), np.asarray(lon, float)


__all__ = ["DRIVABLE", "read_osm"]
