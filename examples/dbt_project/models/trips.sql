-- The sensitive table: real trajectories in duckmob's input shape (traj_id, user_id, ts, lat, lon).
select traj_id, user_id, ts, lat, lon
from {{ source('geolife', 'sample') }}
