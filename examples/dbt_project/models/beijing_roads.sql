-- Public road segments over the sample's box: the central Beijing roads shipped with duckmob (OpenStreetMap as
-- mapped in 2013; (c) OpenStreetMap contributors, ODbL 1.0: duckmob/data/ROADS_README.md). Run with
-- --vars '{roads: beijing_roads}' and synthetic_trips puts every synthetic point on them (docs/roads.md).
from mob_beijing_roads()
