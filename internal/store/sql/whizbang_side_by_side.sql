-- The script that lets a Whizbang fleet move to our schema with both fleets readable
-- during the move. scripts/whizbang-side-by-side.sql is it, rendered for Whizbang's
-- defaults and the default schema (TestSideBySideScriptIsUpToDate keeps it so). It is
-- never sent by the exporter.

-- script: whizbang_side_by_side
-- {schema} the schema that holds our migrations, {table} the Whizbang table, {verdicts}
-- Whizbang's verdict with the function's own parameters for the source's timing and key
-- prefix (below), {*_default} their defaults.

-- Moving a Whizbang fleet to pg_liveness, side by side. Generated from the exporter's
-- Whizbang source (internal/store/sql/whizbang_side_by_side.sql); do not edit by hand.
--
-- Run it once, after pg_liveness's migrations created schema {schema}, as a role that may
-- create functions there. It reads {table}
-- and writes nothing to it. Then, in this order:
--   1. Point callers at {schema}.is_fleet_instance_alive(id) instead of Whizbang's
--      is_instance_alive(id, seconds): it answers for instances of either fleet.
--   2. Deploy services built on pg_liveness one at a time. Their instances register in
--      {schema}.instances; the Whizbang instances they replace leave Whizbang's table when
--      Whizbang removes or reaps them.
--   3. Watch both fleets: SELECT * FROM {schema}.fleet_instance_states(), and an exporter
--      with --no-agent --source=whizbang next to the usual one.
--   4. When SELECT count(*) FROM {schema}.whizbang_instance_states() is 0, switch callers
--      to {schema}.is_instance_alive(id), drop these three functions (below, commented
--      out) and then Whizbang's tables.

-- Whizbang's instances by pg_liveness's states. A Whizbang row records no timing, so the
-- stale threshold and definitive-dead cutoff are arguments (defaults: Whizbang's cadence).
-- Instances whose 32-bit lock keys collide are judged by their heartbeats (key_shared).
CREATE OR REPLACE FUNCTION {schema}.whizbang_instance_states(
        p_stale_threshold        interval DEFAULT {stale_default},
        p_definitive_dead_cutoff interval DEFAULT {dead_default},
        p_lock_key_prefix        text     DEFAULT {lock_key_prefix_default})
    RETURNS TABLE (instance_id uuid, service_name text, host_name text, process_id integer,
                   started_at timestamptz, metadata jsonb, state text, alive boolean,
                   lock_held boolean, key_shared boolean, last_heartbeat_at timestamptz)
    LANGUAGE sql STABLE
AS $$
    SELECT * FROM {verdicts} v
$$;

-- Both fleets: source is 'liveness' or 'whizbang'. An id in both (an instance that
-- re-registered under pg_liveness with its Whizbang id) counts once, as pg_liveness's.
CREATE OR REPLACE FUNCTION {schema}.fleet_instance_states()
    RETURNS TABLE (source text, instance_id uuid, service_name text, state text, alive boolean,
                   last_heartbeat_at timestamptz)
    LANGUAGE sql VOLATILE
AS $$
    SELECT 'liveness', s.instance_id, s.service_name, s.state, s.alive, s.last_heartbeat_at
      FROM {schema}.instance_states() s
    UNION ALL
    SELECT 'whizbang', w.instance_id, w.service_name, w.state, w.alive, w.last_heartbeat_at
      FROM {schema}.whizbang_instance_states() w
     WHERE NOT EXISTS (SELECT 1 FROM {schema}.instances i WHERE i.instance_id = w.instance_id)
$$;

-- Alive in either fleet; false for an id in neither.
CREATE OR REPLACE FUNCTION {schema}.is_fleet_instance_alive(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM {schema}.instances i WHERE i.instance_id = p_instance_id)
            THEN {schema}.is_instance_alive(p_instance_id)
        ELSE coalesce((SELECT w.alive FROM {schema}.whizbang_instance_states() w
                        WHERE w.instance_id = p_instance_id), false)
    END
$$;

-- When the move is done:
-- DROP FUNCTION {schema}.is_fleet_instance_alive(uuid);
-- DROP FUNCTION {schema}.fleet_instance_states();
-- DROP FUNCTION {schema}.whizbang_instance_states(interval, interval, text);

-- fragment: side_by_side.stale
-- whizbang_instance_states' parameters, for whizbang.verdicts inside its body.
p_stale_threshold

-- fragment: side_by_side.dead
p_definitive_dead_cutoff

-- fragment: side_by_side.lock_key_prefix
p_lock_key_prefix
