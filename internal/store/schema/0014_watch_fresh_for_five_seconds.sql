-- compatible-from: 1
-- Older binaries keep working: this replaces a function with the same arguments and
-- result.
--
-- While a watcher has ticked lately, refused lease tries and is_instance_alive judge from
-- the rows and their absence stamps (index lookups); otherwise from the full verdict,
-- which reads pg_locks. "Lately" was one second: a server slowed down by load (a fleet of
-- a thousand starting at once) delays the watcher's ticks past it, every refused try then
-- reads pg_locks, which slows the server further, and the fleet could not start. Five
-- seconds keeps the cheap answers through such a slowdown. The price is on the side of
-- life: a lock that vanished while the watcher lags counts as held until it is stamped,
-- so a crash is called dead later then, never a live instance dead; and the sentries
-- (migration 0011) stand in for a watcher that stopped within half a second anyway.
CREATE OR REPLACE FUNCTION alive_lock_watch_is_fresh() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (SELECT 1 FROM alive_lock_watch w
                    WHERE w.server_started_at = pg_catalog.pg_postmaster_start_time()
                      AND w.watched_at > pg_catalog.clock_timestamp() - interval '5 seconds')
$$;
