-- The reads of liveness.Reader: one instance or a service's instances, and a whole
-- fleet at once (the status page). Both read the source's verdict ({states},
-- {all_states}), whose {stale} and {dead} are the source's timing for rows that record
-- none; the source's fragments are in source_liveness.sql and source_whizbang.sql.

-- name: read_instances
-- The verdict joined to the rows' identity, with the heartbeat's age by the database
-- clock, the start, the mode, the metadata and the recorded timing in seconds.
-- $1 one instance id or NULL, $2 a service name or NULL.
SELECT s.instance_id, s.service_name, i.host_name, i.process_id,
       s.state, s.alive, coalesce(s.lock_held, false) AS lock_held, s.last_heartbeat_at,
       extract(epoch FROM now() - s.last_heartbeat_at)::float8 AS heartbeat_age, i.started_at,
       {mode} AS liveness_mode, coalesce(i.metadata, '{}')::text AS metadata,
       {heartbeat_interval} AS heartbeat_interval, {heartbeat_slow_interval} AS heartbeat_slow_interval,
       {stale_threshold} AS stale_threshold, {definitive_dead_cutoff} AS definitive_dead_cutoff,
       {lock_grace} AS lock_grace
  FROM {states} s
  JOIN {instances} i ON i.instance_id = s.instance_id
 WHERE ($1::uuid IS NULL OR s.instance_id = $1::uuid) AND ($2::text IS NULL OR s.service_name = $2::text)
 ORDER BY s.service_name, s.instance_id

-- name: read_fleet
-- Reads the verdict once (for our schema instance_states, which stamps vanished locks
-- first) and returns, as one JSON object a row: a 'meta' row (clock, database, standby,
-- how many instances and leases match), a 'count' row per service and state, the page of
-- instances and the page of leases; an instance and a count say whether their state is
-- alive, as the verdict says (CollectFleet decodes them). Lease rows carry their holder's state from the same
-- evaluation; their "held" is lease_is_free's rule (not expired, holder alive when
-- recorded) applied to it, since calling lease_is_free per lease would evaluate the
-- verdict again for each.
-- $1 a service or NULL, $2 an instance id or NULL; $3 offset and $4 limit of instances;
-- $5 a lease name fragment or NULL; $6 offset and $7 limit of leases.
WITH v AS MATERIALIZED (
    SELECT s.instance_id, s.service_name, s.state, s.alive, s.lock_held, s.last_heartbeat_at
      FROM {all_states} s
), picked AS (
    SELECT v.*, CASE v.state WHEN 'zombie' THEN 0 WHEN 'stale' THEN 1 WHEN 'lock_lost' THEN 2
                             WHEN 'lock_only' THEN 3 ELSE 4 END AS rank
      FROM v
     WHERE ($1::text IS NULL OR v.service_name = $1::text) AND ($2::uuid IS NULL OR v.instance_id = $2::uuid)
), page AS ( -- a top-N sort: only offset + limit rows are kept in order
    SELECT p.*, row_number() OVER (ORDER BY p.rank, p.service_name, p.instance_id) AS ord
      FROM (SELECT * FROM picked ORDER BY rank, service_name, instance_id LIMIT $4 OFFSET $3) p
), lease_rows AS MATERIALIZED (
    SELECT l.name, l.holder_instance_id, coalesce(l.holder_host, split_part(l.holder, ':', 1)) AS holder_host,
           l.epoch, l.taken_at, l.expires_at, h.service_name AS holder_service, h.state AS holder_state,
           extract(epoch FROM l.expires_at - now())::float8 AS expires_in,
           extract(epoch FROM now() - l.taken_at)::float8 AS held_for,
           l.expires_at >= now() AND (l.holder_instance_id IS NULL OR coalesce(h.alive, false)) AS held
      FROM {leases} l
      LEFT JOIN v h ON h.instance_id = l.holder_instance_id
     WHERE $5::text IS NULL OR strpos(lower(l.name), lower($5::text)) > 0
), lease_page AS (
    SELECT r.*, row_number() OVER (ORDER BY CASE WHEN r.held THEN 2 WHEN r.expires_in >= 0 THEN 0 ELSE 1 END,
                                             r.name) AS ord
      FROM lease_rows r
)
SELECT 'meta' AS kind, 0::bigint AS ord, jsonb_build_object('now', now(), 'database', current_database(),
       'in_recovery', pg_is_in_recovery(), 'instances', (SELECT count(*) FROM picked),
       'leases', (SELECT count(*) FROM lease_rows)) AS object
UNION ALL
SELECT 'count', 0, jsonb_build_object('service', v.service_name, 'state', v.state, 'alive', v.alive, 'count', count(*),
       'oldest_age', extract(epoch FROM now() - min(v.last_heartbeat_at))::float8)
  FROM v GROUP BY v.service_name, v.state, v.alive
UNION ALL
SELECT 'instance', p.ord, jsonb_build_object('instance_id', p.instance_id, 'service_name', p.service_name,
       'host_name', i.host_name, 'process_id', i.process_id, 'state', p.state, 'alive', p.alive,
       'lock_held', coalesce(p.lock_held, false), 'last_heartbeat_at', p.last_heartbeat_at,
       'heartbeat_age', extract(epoch FROM now() - p.last_heartbeat_at)::float8, 'started_at', i.started_at,
       'liveness_mode', {mode}, 'metadata', i.metadata,
       'heartbeat_interval', {heartbeat_interval}, 'heartbeat_slow_interval', {heartbeat_slow_interval},
       'stale_threshold', {stale_threshold}, 'definitive_dead_cutoff', {definitive_dead_cutoff},
       'lock_grace', {lock_grace})
  FROM page p JOIN {instances} i ON i.instance_id = p.instance_id
UNION ALL
SELECT 'lease', p.ord, to_jsonb(p) - 'ord'
  FROM lease_page p
 WHERE p.ord > $6 AND p.ord <= $6 + $7
