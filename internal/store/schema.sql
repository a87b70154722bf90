-- The schema as it stands after the last migration, 0021_every_vanished_lock_stamped: every table, sequence,
-- index, view, trigger and function with its body, read back from the catalog of PostgreSQL 15
-- once every migration is applied. The migrations (internal/store/schema/) are the history,
-- this is the result; it is ordered by kind for reading, not by dependency for running.
-- Generated and checked by TestSchemaFileIsCurrent; do not edit by hand:
--   go test ./internal/store -run TestSchemaFileIsCurrent -update (on PostgreSQL 15: PG_LIVENESS_TEST_PG_MAJOR unset)

CREATE SCHEMA liveness;

-- Sequences

CREATE SEQUENCE liveness.history_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE SEQUENCE liveness.lease_epoch_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;
ALTER SEQUENCE liveness.lease_epoch_seq OWNED BY liveness.leases.epoch;

-- Tables

CREATE TABLE liveness.alive_lock_absences (
    instance_id uuid NOT NULL,
    missing_since timestamp with time zone NOT NULL,
    server_started_at timestamp with time zone NOT NULL,
    lock_pid integer,
    notified_at timestamp with time zone,
    CONSTRAINT alive_lock_absences_pkey PRIMARY KEY (instance_id)
);

CREATE TABLE liveness.alive_lock_expectations (
    shard integer NOT NULL,
    generation bigint NOT NULL DEFAULT 0,
    CONSTRAINT alive_lock_expectations_pkey PRIMARY KEY (shard),
    CONSTRAINT alive_lock_expectations_shard_check CHECK (((shard >= 0) AND (shard < 64)))
);

CREATE TABLE liveness.alive_lock_watch (
    singleton boolean NOT NULL DEFAULT true,
    watched_at timestamp with time zone NOT NULL,
    server_started_at timestamp with time zone NOT NULL,
    lock_count integer,
    CONSTRAINT alive_lock_watch_pkey PRIMARY KEY (singleton),
    CONSTRAINT alive_lock_watch_singleton_check CHECK (singleton)
);

CREATE TABLE liveness.event_channels (
    singleton boolean NOT NULL DEFAULT true,
    events text NOT NULL,
    members text NOT NULL,
    CONSTRAINT event_channels_pkey PRIMARY KEY (singleton),
    CONSTRAINT event_channels_singleton_check CHECK (singleton)
);

CREATE TABLE liveness.fence_checks (
    lease_name text NOT NULL,
    epoch bigint NOT NULL,
    deadline timestamp with time zone NOT NULL,
    commit_key text,
    CONSTRAINT fence_checks_at_commit TRIGGER DEFERRABLE INITIALLY DEFERRED
);

CREATE TABLE liveness.history (
    id bigint NOT NULL,
    at timestamp with time zone NOT NULL,
    kind text NOT NULL,
    lease_name text,
    epoch bigint,
    instance_id uuid,
    host text,
    service text,
    how text,
    reason text,
    since timestamp with time zone,
    dead_at timestamp with time zone,
    CONSTRAINT history_pkey PRIMARY KEY (id)
);
CREATE INDEX history_at_idx ON liveness.history USING btree (at);
CREATE INDEX history_instance_idx ON liveness.history USING btree (instance_id, at) WHERE (instance_id IS NOT NULL);
CREATE INDEX history_lease_idx ON liveness.history USING btree (lease_name, at) WHERE (lease_name IS NOT NULL);
CREATE UNIQUE INDEX history_one_death_idx ON liveness.history USING btree (instance_id, since) WHERE (kind = 'dead'::text);

CREATE TABLE liveness.instances (
    instance_id uuid NOT NULL,
    service_name text NOT NULL,
    host_name text NOT NULL DEFAULT ''::text,
    process_id integer NOT NULL DEFAULT 0,
    started_at timestamp with time zone NOT NULL DEFAULT now(),
    last_heartbeat_at timestamp with time zone NOT NULL DEFAULT now(),
    liveness_mode text NOT NULL DEFAULT 'advisory-lock-when-available'::text,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    lock_classid oid GENERATED ALWAYS AS (liveness.lock_key_classid(liveness.instance_lock_key(instance_id))) STORED,
    lock_objid oid GENERATED ALWAYS AS (liveness.lock_key_objid(liveness.instance_lock_key(instance_id))) STORED,
    heartbeat_interval interval,
    heartbeat_slow_interval interval,
    stale_threshold interval,
    definitive_dead_cutoff interval,
    lock_grace interval,
    holds_alive_lock boolean NOT NULL DEFAULT false,
    lock_pid integer,
    CONSTRAINT instances_liveness_mode_check CHECK ((liveness_mode = ANY (ARRAY['advisory-lock-when-available'::text, 'heartbeat-table-only'::text]))),
    CONSTRAINT instances_pkey PRIMARY KEY (instance_id)
);
CREATE INDEX instances_last_heartbeat_at_idx ON liveness.instances USING btree (last_heartbeat_at);
CREATE INDEX instances_lock_key_idx ON liveness.instances USING btree (lock_classid, lock_objid);
CREATE INDEX instances_service_name_idx ON liveness.instances USING btree (service_name);

CREATE TABLE liveness.leases (
    name text NOT NULL,
    holder text NOT NULL,
    epoch bigint NOT NULL DEFAULT nextval('liveness.lease_epoch_seq'::regclass),
    taken_at timestamp with time zone NOT NULL DEFAULT now(),
    expires_at timestamp with time zone NOT NULL,
    holder_instance_id uuid,
    holder_host text,
    CONSTRAINT leases_epoch_key UNIQUE (epoch),
    CONSTRAINT leases_pkey PRIMARY KEY (name)
);
CREATE INDEX leases_expires_at_idx ON liveness.leases USING btree (expires_at);
CREATE INDEX leases_name_bytes_idx ON liveness.leases USING btree (name COLLATE "C");

CREATE TABLE liveness.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now(),
    compatible_from integer,
    CONSTRAINT schema_migrations_pkey PRIMARY KEY (version)
);

-- Views

CREATE VIEW liveness.bigint_advisory_locks AS
 SELECT l.pid,
    l.granted,
    l.classid,
    l.objid,
    l.mode
   FROM pg_locks l
  WHERE l.locktype = 'advisory'::text AND l.objsubid = 1 AND l.database = (( SELECT d.oid
           FROM pg_database d
          WHERE d.datname = current_database()));

CREATE VIEW liveness.instance_alive_locks AS
 SELECT i.instance_id,
    l.pid
   FROM liveness.instances i
     JOIN liveness.bigint_advisory_locks l ON l.granted AND l.classid = i.lock_classid AND l.objid = i.lock_objid AND (i.lock_pid IS NULL OR l.pid = i.lock_pid);

-- Triggers

CREATE CONSTRAINT TRIGGER fence_checks_at_commit AFTER INSERT ON liveness.fence_checks DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION liveness.fence_check_at_commit();

CREATE TRIGGER instances_expect_lock_insert AFTER INSERT ON liveness.instances FOR EACH ROW WHEN (new.holds_alive_lock) EXECUTE FUNCTION liveness.note_alive_lock_expected();

CREATE TRIGGER instances_expect_lock_update AFTER UPDATE OF holds_alive_lock, lock_pid ON liveness.instances FOR EACH ROW WHEN (new.holds_alive_lock AND (NOT old.holds_alive_lock OR old.lock_pid IS DISTINCT FROM new.lock_pid)) EXECUTE FUNCTION liveness.note_alive_lock_expected();

CREATE TRIGGER instances_notify_joined AFTER INSERT ON liveness.instances FOR EACH ROW EXECUTE FUNCTION liveness.notify_instance_event();

CREATE TRIGGER instances_notify_left AFTER DELETE ON liveness.instances FOR EACH ROW EXECUTE FUNCTION liveness.notify_instance_event();

CREATE TRIGGER leases_notify_free AFTER DELETE ON liveness.leases FOR EACH ROW EXECUTE FUNCTION liveness.notify_lease_free();

CREATE TRIGGER leases_notify_taken_insert AFTER INSERT ON liveness.leases FOR EACH ROW EXECUTE FUNCTION liveness.notify_lease_taken();

CREATE TRIGGER leases_notify_taken_update AFTER UPDATE OF epoch ON liveness.leases FOR EACH ROW WHEN (old.epoch IS DISTINCT FROM new.epoch) EXECUTE FUNCTION liveness.notify_lease_taken();

-- Functions

CREATE OR REPLACE FUNCTION liveness.alive_lock_absences_digest()
 RETURNS text
 LANGUAGE sql
 STABLE
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT count(*)::text || ':'
           || coalesce(bit_xor(pg_catalog.hashtextextended(a.instance_id::text || a.missing_since::text, 0)), 0)::text
      FROM alive_lock_absences a
$function$
;

CREATE OR REPLACE FUNCTION liveness.alive_lock_held(p_instance_id uuid)
 RETURNS boolean
 LANGUAGE sql
 STABLE STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT EXISTS (
        SELECT 1 FROM bigint_advisory_locks l
         WHERE l.granted
           AND l.classid = lock_key_classid(instance_lock_key(p_instance_id))
           AND l.objid = lock_key_objid(instance_lock_key(p_instance_id))
           AND coalesce(l.pid = (SELECT i.lock_pid FROM instances i WHERE i.instance_id = p_instance_id), true))
$function$
;

CREATE OR REPLACE FUNCTION liveness.alive_lock_holder(p_instance_id uuid)
 RETURNS TABLE(holder_pid integer, claimed boolean)
 LANGUAGE sql
 STABLE STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT l.pid, coalesce(l.pid = (SELECT i.lock_pid FROM instances i WHERE i.instance_id = p_instance_id), true)
      FROM bigint_advisory_locks l
     WHERE l.granted AND l.mode = 'ExclusiveLock'
       AND l.classid = lock_key_classid(instance_lock_key(p_instance_id))
       AND l.objid = lock_key_objid(instance_lock_key(p_instance_id))
$function$
;

CREATE OR REPLACE FUNCTION liveness.alive_lock_watch_is_fresh()
 RETURNS boolean
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT EXISTS (SELECT 1 FROM alive_lock_watch w
                    WHERE w.server_started_at = pg_catalog.pg_postmaster_start_time()
                      AND w.watched_at > pg_catalog.clock_timestamp() - interval '5 seconds')
$function$
;

CREATE OR REPLACE FUNCTION liveness.alive_lock_watch_state()
 RETURNS TABLE(age double precision, lock_count integer)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT extract(epoch FROM pg_catalog.clock_timestamp() - w.watched_at)::float8, w.lock_count
      FROM alive_lock_watch w
     WHERE w.server_started_at = pg_catalog.pg_postmaster_start_time()
$function$
;

CREATE OR REPLACE FUNCTION liveness.caller_participates()
 RETURNS boolean
 LANGUAGE sql
 STABLE
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$ SELECT pg_catalog.has_table_privilege(session_user, 'instances', 'UPDATE') $function$
;

CREATE OR REPLACE FUNCTION liveness.claim_instance_alive_lock(p_instance_id uuid)
 RETURNS boolean
 LANGUAGE plpgsql
 STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT pg_catalog.pg_try_advisory_lock(instance_lock_key(p_instance_id)) THEN
        RETURN false;
    END IF;
    UPDATE instances i SET lock_pid = pg_catalog.pg_backend_pid()
     WHERE i.instance_id = p_instance_id AND i.lock_pid IS DISTINCT FROM pg_catalog.pg_backend_pid();
    RETURN true;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.cleanup_stale_instances(p_stale_cutoff timestamp with time zone, p_definitive_dead_cutoff timestamp with time zone DEFAULT NULL::timestamp with time zone)
 RETURNS SETOF uuid
 LANGUAGE sql
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    DELETE FROM instances i
     USING instance_states(now() - p_stale_cutoff,
                           coalesce(now() - p_definitive_dead_cutoff, interval '1000 years')) s
     WHERE s.instance_id = i.instance_id
       AND NOT s.alive
       AND i.last_heartbeat_at = s.last_heartbeat_at
    RETURNING i.instance_id
$function$
;

CREATE OR REPLACE FUNCTION liveness.current_alive_lock_absences()
 RETURNS TABLE(instance_id uuid, missing_since timestamp with time zone)
 LANGUAGE sql
 STABLE SECURITY DEFINER ROWS 10
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT a.instance_id, a.missing_since
      FROM alive_lock_absences a
      JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
     WHERE a.server_started_at = pg_catalog.pg_postmaster_start_time()
$function$
;

CREATE OR REPLACE FUNCTION liveness.event_fits(p_payload text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT pg_catalog.octet_length(p_payload) < 8000 $function$
;

CREATE OR REPLACE FUNCTION liveness.events_channel()
 RETURNS text
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$ SELECT c.events FROM event_channels c $function$
;

CREATE OR REPLACE FUNCTION liveness.events_listen()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', events_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_events';
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.fence(p_name text, p_holder text, p_epoch bigint, p_deadline timestamp with time zone, p_raise boolean DEFAULT false)
 RETURNS TABLE(held boolean, in_time boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_row pg_catalog.tid;
BEGIN
    PERFORM 1 FROM liveness.leases l
      WHERE l.name OPERATOR(pg_catalog.=) p_name
        AND l.holder OPERATOR(pg_catalog.=) liveness.lease_token(p_holder)
        AND l.epoch OPERATOR(pg_catalog.=) p_epoch
        AND l.expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp()
        FOR KEY SHARE;
    held := FOUND;
    in_time := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) p_deadline;
    IF p_raise AND NOT held THEN
        RAISE EXCEPTION 'liveness: lease % is not held under epoch %', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF p_raise AND NOT coalesce(in_time, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease % (epoch %) came past its deadline %', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO liveness.fence_checks (lease_name, epoch, deadline, commit_key)
         VALUES (p_name, p_epoch, CASE WHEN held THEN coalesce(p_deadline, '-infinity') ELSE '-infinity' END,
                 liveness.fence_commit_key(p_holder))
      RETURNING ctid INTO v_row;
    DELETE FROM liveness.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
    RETURN NEXT;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.fence_check_at_commit()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_set      pg_catalog.text;
    v_deadline pg_catalog.timestamptz := NEW.deadline;
    v_row      pg_catalog.tid;
BEGIN
    IF NEW.epoch OPERATOR(pg_catalog.=) (-1) THEN
        PERFORM pg_catalog.set_config('pg_liveness.fence_probe', 'fired', true);
        RETURN NULL;
    END IF;
    PERFORM pg_catalog.set_config('pg_liveness.fence_probe', '', true);
    INSERT INTO liveness.fence_checks (lease_name, epoch, deadline) VALUES (NEW.lease_name, -1, '-infinity')
      RETURNING ctid INTO v_row;
    DELETE FROM liveness.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
    IF pg_catalog.current_setting('pg_liveness.fence_probe') OPERATOR(pg_catalog.=) 'fired' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused: its check at COMMIT was made to run early '
                        '(SET CONSTRAINTS ... IMMEDIATE); name your own constraints in SET CONSTRAINTS instead of ALL',
                        NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF04';
    END IF;
    IF pg_catalog.current_query() OPERATOR(pg_catalog.~*) '\mprepare\s+transaction\M' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused: it cannot be prepared for two-phase '
                        'commit, whose COMMIT PREPARED would not be checked', NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF05';
    END IF;
    v_set := pg_catalog.current_setting('pg_liveness.commit_deadline', true);
    -- Nested, not one AND: SQL does not stop at the first false (or null) operand, and the
    -- hash is for a deadline that was set.
    IF v_set OPERATOR(pg_catalog.<>) '' THEN
        IF pg_catalog.split_part(v_set, ':', 1) OPERATOR(pg_catalog.=) NEW.epoch::pg_catalog.text
           AND pg_catalog.split_part(v_set, ':', 3) OPERATOR(pg_catalog.=) pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                   NEW.commit_key OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) NEW.epoch::pg_catalog.text
                   OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.split_part(v_set, ':', 2), 'UTF8')), 'hex') THEN
            -- OPERATOR() forms share one precedence: the parentheses say which comes first.
            v_deadline := 'epoch'::pg_catalog.timestamptz OPERATOR(pg_catalog.+)
                          (pg_catalog.split_part(v_set, ':', 2)::pg_catalog.int8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval);
        END IF;
    END IF;
    IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) v_deadline THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused at commit: past its fence deadline %',
                        NEW.lease_name, NEW.epoch, v_deadline
              USING ERRCODE = 'LVF03';
    END IF;
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.fence_commit_key(p_holder text)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE STRICT
AS $function$ SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to('pg_liveness.commit:' OPERATOR(pg_catalog.||) p_holder,
                                                                        'UTF8')), 'hex') $function$
;

CREATE OR REPLACE FUNCTION liveness.fence_exec(p_name text, p_holder text, p_epoch bigint, p_deadline timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_row pg_catalog.tid;
BEGIN
    PERFORM 1 FROM liveness.leases l
      WHERE l.name OPERATOR(pg_catalog.=) p_name
        AND l.holder OPERATOR(pg_catalog.=) liveness.lease_token(p_holder)
        AND l.epoch OPERATOR(pg_catalog.=) p_epoch
        AND l.expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp()
        FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'liveness: lease % is not held under epoch %', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF NOT coalesce(pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) p_deadline, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease % (epoch %) came past its deadline %', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO liveness.fence_checks (lease_name, epoch, deadline) VALUES (p_name, p_epoch, p_deadline)
      RETURNING ctid INTO v_row;
    -- The check stays queued; the row has done its part.
    DELETE FROM liveness.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.history_death_of(p_instance_id uuid)
 RETURNS TABLE(last_alive_at timestamp with time zone, dead_at timestamp with time zone, how text, host text, service text)
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT d.last_alive_at, d.dead_at, d.how, i.host_name, i.service_name
      FROM instances i
      LEFT JOIN alive_lock_absences a
             ON a.instance_id = i.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
            AND a.lock_pid IS NOT DISTINCT FROM i.lock_pid
     CROSS JOIN LATERAL history_death_times(i.holds_alive_lock,
                            EXISTS (SELECT 1 FROM instance_alive_locks k WHERE k.instance_id = i.instance_id),
                            i.last_heartbeat_at, a.missing_since, i.lock_grace, i.stale_threshold,
                            i.definitive_dead_cutoff) d
     WHERE i.instance_id = p_instance_id
$function$
;

CREATE OR REPLACE FUNCTION liveness.history_death_times(p_holds_alive_lock boolean, p_locked boolean, p_last_heartbeat_at timestamp with time zone, p_missing_since timestamp with time zone, p_grace interval, p_stale interval, p_dead interval)
 RETURNS TABLE(last_alive_at timestamp with time zone, dead_at timestamp with time zone, how text)
 LANGUAGE sql
 IMMUTABLE
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT CASE WHEN k.by_lock THEN p_missing_since ELSE p_last_heartbeat_at END,
           CASE WHEN k.by_lock THEN k.lock_dead
                WHEN k.zombie THEN p_last_heartbeat_at + coalesce(p_dead, interval '5 minutes')
                ELSE k.stale_dead END,
           CASE WHEN k.by_lock THEN 'lock_lost' WHEN k.zombie THEN 'zombie' ELSE 'heartbeat_stale' END
      FROM (SELECT d.lock_dead, d.stale_dead, coalesce(d.lock_dead <= d.stale_dead, false) AS by_lock,
                   d.lock_dead IS NULL AND p_holds_alive_lock AND p_locked AS zombie
              FROM (SELECT CASE WHEN p_holds_alive_lock THEN p_missing_since + coalesce(p_grace, interval '1 second') END
                               AS lock_dead,
                           p_last_heartbeat_at + coalesce(p_stale, interval '90 seconds') AS stale_dead) d) k
$function$
;

CREATE OR REPLACE FUNCTION liveness.history_note_dead(p_instance_id uuid)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    WITH noted AS (
        INSERT INTO history (at, kind, instance_id, host, service, how, since, dead_at)
        SELECT least(d.dead_at, pg_catalog.clock_timestamp()), 'dead', p_instance_id, d.host, d.service, d.how, d.last_alive_at,
               least(d.dead_at, pg_catalog.clock_timestamp())
          FROM history_death_of(p_instance_id) d
        ON CONFLICT (instance_id, since) WHERE kind = 'dead' DO NOTHING
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM noted)
$function$
;

CREATE OR REPLACE FUNCTION liveness.history_prune(p_keep interval, p_batch integer)
 RETURNS TABLE(pruned bigint, ahead bigint)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    WITH first AS (SELECT h.at FROM history h ORDER BY h.id LIMIT 1),
    oldest AS (SELECT h.id FROM history h
                WHERE EXISTS (SELECT 1 FROM first f
                               WHERE f.at < pg_catalog.now() - p_keep OR f.at > pg_catalog.now() + interval '1 day')
                ORDER BY h.id LIMIT greatest(p_batch, 1)),
    gone AS (DELETE FROM history h USING oldest o
              WHERE h.id = o.id
                AND (h.at < pg_catalog.now() - p_keep OR h.at > pg_catalog.now() + interval '1 day')
             RETURNING h.at > pg_catalog.now() AS ahead)
    SELECT count(*), count(*) FILTER (WHERE g.ahead) FROM gone g
$function$
;

CREATE OR REPLACE FUNCTION liveness.instance_lock_key(p_instance_id uuid)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$ SELECT pg_catalog.hashtextextended('pg_liveness.alive:' || p_instance_id::text, 0) $function$
;

CREATE OR REPLACE FUNCTION liveness.instance_state_rule(p_locked boolean, p_holds_alive_lock boolean, p_last_heartbeat_at timestamp with time zone, p_now timestamp with time zone, p_stale interval, p_dead interval, p_missing_since timestamp with time zone, p_grace interval)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN p_locked AND p_last_heartbeat_at <= p_now - p_dead THEN 'zombie'
        WHEN p_locked AND p_last_heartbeat_at > p_now - p_stale THEN 'alive'
        WHEN p_locked THEN 'lock_only'
        WHEN p_last_heartbeat_at <= p_now - p_stale THEN 'stale'
        WHEN p_holds_alive_lock AND coalesce(p_missing_since > p_now - p_grace, true) THEN 'lock_lost'
        WHEN p_holds_alive_lock THEN 'stale'
        ELSE 'heartbeat_only'
    END
$function$
;

CREATE OR REPLACE FUNCTION liveness.instance_state_verdicts(p_stale_threshold interval DEFAULT '00:01:30'::interval, p_definitive_dead_cutoff interval DEFAULT '00:05:00'::interval, p_instance_id uuid DEFAULT NULL::uuid)
 RETURNS TABLE(instance_id uuid, service_name text, state text, alive boolean, lock_held boolean, last_heartbeat_at timestamp with time zone)
 LANGUAGE sql
 STABLE
BEGIN ATOMIC
 SELECT c.instance_id,
     c.service_name,
     s.state,
     (s.state = ANY (ARRAY['alive'::text, 'lock_only'::text, 'lock_lost'::text, 'heartbeat_only'::text])),
     c.locked,
     c.last_heartbeat_at
    FROM (( SELECT i.instance_id,
             i.service_name,
             i.last_heartbeat_at,
             i.holds_alive_lock,
             i.stale_threshold,
             i.definitive_dead_cutoff,
             i.lock_grace,
                 CASE
                     WHEN (NOT ( SELECT pg_is_in_recovery() AS pg_is_in_recovery)) THEN (k.classid IS NOT NULL)
                     ELSE NULL::boolean
                 END AS locked
            FROM (liveness.instances i
              LEFT JOIN ( SELECT l.classid,
                     l.objid,
                     l.pid
                    FROM liveness.bigint_advisory_locks l
                   WHERE (l.granted AND (l.mode = 'ExclusiveLock'::text))) k ON (((k.classid = i.lock_classid) AND (k.objid = i.lock_objid) AND ((i.lock_pid IS NULL) OR (k.pid = i.lock_pid)))))
           WHERE ((instance_state_verdicts.p_instance_id IS NULL) OR (i.instance_id = instance_state_verdicts.p_instance_id))) c
      CROSS JOIN LATERAL ( SELECT liveness.instance_state_rule(COALESCE(c.locked, false), (c.holds_alive_lock AND (c.locked IS NOT NULL)), c.last_heartbeat_at, now(), COALESCE(c.stale_threshold, instance_state_verdicts.p_stale_threshold), COALESCE(c.definitive_dead_cutoff, instance_state_verdicts.p_definitive_dead_cutoff),
                 CASE
                     WHEN (c.holds_alive_lock AND (NOT c.locked)) THEN ( SELECT a.missing_since
                        FROM liveness.current_alive_lock_absences() a(instance_id, missing_since)
                       WHERE (a.instance_id = c.instance_id))
                     ELSE NULL::timestamp with time zone
                 END, COALESCE(c.lock_grace, '00:00:01'::interval)) AS state) s);
END
;

CREATE OR REPLACE FUNCTION liveness.instance_state_verdicts_of_locks(p_stale_threshold interval, p_definitive_dead_cutoff interval, p_lock_classid oid[], p_lock_objid oid[])
 RETURNS TABLE(instance_id uuid, service_name text, state text, alive boolean, lock_held boolean, last_heartbeat_at timestamp with time zone)
 LANGUAGE sql
 STABLE
BEGIN ATOMIC
 SELECT c.instance_id,
     c.service_name,
     s.state,
     (s.state = ANY (ARRAY['alive'::text, 'lock_only'::text, 'lock_lost'::text, 'heartbeat_only'::text])),
     c.locked,
     c.last_heartbeat_at
    FROM (( SELECT i.instance_id,
             i.service_name,
             i.last_heartbeat_at,
             i.holds_alive_lock,
             i.stale_threshold,
             i.definitive_dead_cutoff,
             i.lock_grace,
                 CASE
                     WHEN (NOT ( SELECT pg_is_in_recovery() AS pg_is_in_recovery)) THEN (k.classid IS NOT NULL)
                     ELSE NULL::boolean
                 END AS locked
            FROM (liveness.instances i
              LEFT JOIN UNNEST(instance_state_verdicts_of_locks.p_lock_classid, instance_state_verdicts_of_locks.p_lock_objid) k(classid, objid) ON (((k.classid = i.lock_classid) AND (k.objid = i.lock_objid))))) c
      CROSS JOIN LATERAL ( SELECT liveness.instance_state_rule(COALESCE(c.locked, false), (c.holds_alive_lock AND (c.locked IS NOT NULL)), c.last_heartbeat_at, now(), COALESCE(c.stale_threshold, instance_state_verdicts_of_locks.p_stale_threshold), COALESCE(c.definitive_dead_cutoff, instance_state_verdicts_of_locks.p_definitive_dead_cutoff),
                 CASE
                     WHEN (c.holds_alive_lock AND (NOT c.locked)) THEN ( SELECT a.missing_since
                        FROM liveness.current_alive_lock_absences() a(instance_id, missing_since)
                       WHERE (a.instance_id = c.instance_id))
                     ELSE NULL::timestamp with time zone
                 END, COALESCE(c.lock_grace, '00:00:01'::interval)) AS state) s);
END
;

CREATE OR REPLACE FUNCTION liveness.instance_state_verdicts_of_locks(p_stale_threshold interval, p_definitive_dead_cutoff interval, p_lock_classid oid[], p_lock_objid oid[], p_lock_pid integer[])
 RETURNS TABLE(instance_id uuid, service_name text, state text, alive boolean, lock_held boolean, last_heartbeat_at timestamp with time zone)
 LANGUAGE sql
 STABLE
BEGIN ATOMIC
 SELECT c.instance_id,
     c.service_name,
     s.state,
     (s.state = ANY (ARRAY['alive'::text, 'lock_only'::text, 'lock_lost'::text, 'heartbeat_only'::text])),
     c.locked,
     c.last_heartbeat_at
    FROM (( SELECT i.instance_id,
             i.service_name,
             i.last_heartbeat_at,
             i.holds_alive_lock,
             i.stale_threshold,
             i.definitive_dead_cutoff,
             i.lock_grace,
                 CASE
                     WHEN (NOT ( SELECT pg_is_in_recovery() AS pg_is_in_recovery)) THEN (k.classid IS NOT NULL)
                     ELSE NULL::boolean
                 END AS locked
            FROM (liveness.instances i
              LEFT JOIN UNNEST(instance_state_verdicts_of_locks.p_lock_classid, instance_state_verdicts_of_locks.p_lock_objid, instance_state_verdicts_of_locks.p_lock_pid) k(classid, objid, pid) ON (((k.classid = i.lock_classid) AND (k.objid = i.lock_objid) AND ((i.lock_pid IS NULL) OR (k.pid = i.lock_pid)))))) c
      CROSS JOIN LATERAL ( SELECT liveness.instance_state_rule(COALESCE(c.locked, false), (c.holds_alive_lock AND (c.locked IS NOT NULL)), c.last_heartbeat_at, now(), COALESCE(c.stale_threshold, instance_state_verdicts_of_locks.p_stale_threshold), COALESCE(c.definitive_dead_cutoff, instance_state_verdicts_of_locks.p_definitive_dead_cutoff),
                 CASE
                     WHEN (c.holds_alive_lock AND (NOT c.locked)) THEN ( SELECT a.missing_since
                        FROM liveness.current_alive_lock_absences() a(instance_id, missing_since)
                       WHERE (a.instance_id = c.instance_id))
                     ELSE NULL::timestamp with time zone
                 END, COALESCE(c.lock_grace, '00:00:01'::interval)) AS state) s);
END
;

CREATE OR REPLACE FUNCTION liveness.instance_states(p_stale_threshold interval DEFAULT '00:01:30'::interval, p_definitive_dead_cutoff interval DEFAULT '00:05:00'::interval, p_instance_id uuid DEFAULT NULL::uuid)
 RETURNS TABLE(instance_id uuid, service_name text, state text, alive boolean, lock_held boolean, last_heartbeat_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
 SET jit TO 'off'
 SET work_mem TO '32MB'
AS $function$
BEGIN
    PERFORM stamp_alive_lock_absences(p_instance_id);
    RETURN QUERY SELECT * FROM instance_state_verdicts(p_stale_threshold, p_definitive_dead_cutoff, p_instance_id);
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.instance_watched_alive(p_instance_id uuid)
 RETURNS boolean
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT instance_state_rule(i.holds_alive_lock AND a.missing_since IS NULL, i.holds_alive_lock,
                               i.last_heartbeat_at, pg_catalog.now(),
                               coalesce(i.stale_threshold, interval '90 seconds'),
                               coalesce(i.definitive_dead_cutoff, interval '5 minutes'),
                               a.missing_since, coalesce(i.lock_grace, interval '1 second'))
           IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only')
      FROM instances i
      LEFT JOIN alive_lock_absences a
             ON a.instance_id = i.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
            AND a.lock_pid IS NOT DISTINCT FROM i.lock_pid
     WHERE i.instance_id = p_instance_id
$function$
;

CREATE OR REPLACE FUNCTION liveness.is_instance_alive(p_instance_id uuid)
 RETURNS boolean
 LANGUAGE sql
 STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce(CASE WHEN alive_lock_watch_is_fresh() THEN instance_watched_alive(p_instance_id)
                         ELSE (SELECT s.alive FROM instance_states(p_instance_id => p_instance_id) s) END,
                    false)
$function$
;

CREATE OR REPLACE FUNCTION liveness.is_instance_alive(p_instance_id uuid, threshold_seconds integer)
 RETURNS boolean
 LANGUAGE sql
 STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce((SELECT s.alive
                       FROM instance_states(make_interval(secs => threshold_seconds),
                                            p_instance_id => p_instance_id) s), false)
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_abandon(p_name text, p_holder text)
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    WITH gone AS (DELETE FROM leases WHERE name = p_name AND holder = lease_token(p_holder) RETURNING 1)
    SELECT count(*) FROM gone
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_detach(p_name text, p_holder text, p_epoch bigint)
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    WITH left_ AS (UPDATE leases SET holder_instance_id = NULL
                    WHERE name = p_name AND holder = lease_token(p_holder) AND epoch = p_epoch RETURNING 1)
    SELECT count(*) FROM left_
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_extend(p_name text, p_holder text, p_epoch bigint, p_ttl_seconds double precision)
 RETURNS SETOF timestamp with time zone
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    UPDATE leases SET expires_at = now() + make_interval(secs => p_ttl_seconds)
     WHERE name = p_name AND holder = lease_token(p_holder) AND epoch = p_epoch AND expires_at >= now()
    RETURNING expires_at
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_extend_many(p_names text[], p_holders text[], p_epochs bigint[], p_ttl_seconds double precision)
 RETURNS TABLE(name text, expires_at timestamp with time zone)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    UPDATE leases AS l SET expires_at = now() + make_interval(secs => p_ttl_seconds)
      FROM ROWS FROM (pg_catalog.unnest(p_names), pg_catalog.unnest(p_holders), pg_catalog.unnest(p_epochs)) AS t(name, holder, epoch)
     WHERE l.name = t.name AND l.holder = lease_token(t.holder) AND l.epoch = t.epoch AND l.expires_at >= now()
    RETURNING l.name, l.expires_at
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_holder_at(p_name text, p_at timestamp with time zone)
 RETURNS TABLE(epoch bigint, holder_instance_id uuid, holder_host text, acquired_at timestamp with time zone, how text, ended_at timestamp with time zone, ended_how text)
 LANGUAGE sql
 STABLE
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT a.epoch, a.instance_id, a.host, a.at, a.how, e.at, e.how
      FROM (SELECT h.epoch, h.instance_id, h.host, h.at, h.how FROM history h
             WHERE h.lease_name = p_name AND h.kind = 'acquired' AND h.at <= p_at
             ORDER BY h.at DESC, h.id DESC LIMIT 1) a
      LEFT JOIN LATERAL (SELECT h.at, h.how FROM history h
                          WHERE h.lease_name = p_name AND h.kind = 'ended' AND h.epoch = a.epoch
                          ORDER BY h.id LIMIT 1) e ON true
     WHERE e.at IS NULL OR e.at > p_at
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_is_free(p_name text)
 RETURNS boolean
 LANGUAGE sql
 STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT NOT EXISTS (
        SELECT 1 FROM leases l
         WHERE l.name = p_name
           AND l.expires_at >= now()
           AND (l.holder_instance_id IS NULL OR is_instance_alive(l.holder_instance_id)))
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_is_held(p_name text, p_epoch bigint)
 RETURNS boolean
 LANGUAGE sql
 STRICT
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    SELECT coalesce((SELECT true FROM leases l
                      WHERE l.name = p_name AND l.epoch = p_epoch AND l.expires_at >= pg_catalog.clock_timestamp()
                        FOR KEY SHARE), false)
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_let_go(p_name text, p_holder text, p_epoch bigint)
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
AS $function$
    WITH gone AS (DELETE FROM liveness.leases l
                   WHERE l.name OPERATOR(pg_catalog.=) p_name AND l.holder OPERATOR(pg_catalog.=) liveness.lease_token(p_holder)
                     AND l.epoch OPERATOR(pg_catalog.=) p_epoch
                  RETURNING 1)
    SELECT pg_catalog.count(*) FROM gone
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_take(p_name text, p_holder text, p_ttl_seconds double precision, p_instance_id uuid, p_host text)
 RETURNS TABLE(epoch bigint, taken_at timestamp with time zone, expires_at timestamp with time zone, held_by_live boolean, holder_instance_id uuid)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
    WITH taken AS (
        INSERT INTO leases AS l (name, holder, holder_instance_id, holder_host, epoch, taken_at, expires_at)
        SELECT p_name, lease_token(p_holder), p_instance_id, p_host, nextval('lease_epoch_seq'), now(),
               now() + make_interval(secs => p_ttl_seconds)
         WHERE lease_is_free(p_name)
           AND (p_instance_id IS NULL OR is_instance_alive(p_instance_id))
        ON CONFLICT (name) DO UPDATE
           SET holder = excluded.holder, holder_instance_id = excluded.holder_instance_id, holder_host = excluded.holder_host,
               epoch = excluded.epoch, taken_at = excluded.taken_at, expires_at = excluded.expires_at
         WHERE l.expires_at < now()
            OR (l.holder_instance_id IS NOT NULL AND NOT is_instance_alive(l.holder_instance_id))
        RETURNING l.epoch, l.taken_at, l.expires_at
    )
    SELECT t.epoch, t.taken_at, t.expires_at, false, NULL::uuid FROM taken t
    UNION ALL
    SELECT NULL, NULL, NULL, NOT lease_is_free(p_name), (SELECT l.holder_instance_id FROM leases l WHERE l.name = p_name)
     WHERE NOT EXISTS (SELECT 1 FROM taken)
$function$
;

CREATE OR REPLACE FUNCTION liveness.lease_token(p_holder text)
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE STRICT
AS $function$ SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_holder, 'UTF8')), 'hex') $function$
;

CREATE OR REPLACE FUNCTION liveness.lock_key_classid(p_key bigint)
 RETURNS oid
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$ SELECT ((p_key >> 32) & 4294967295)::oid $function$
;

CREATE OR REPLACE FUNCTION liveness.lock_key_objid(p_key bigint)
 RETURNS oid
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$ SELECT (p_key & 4294967295)::oid $function$
;

CREATE OR REPLACE FUNCTION liveness.members_channel()
 RETURNS text
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$ SELECT c.members FROM event_channels c $function$
;

CREATE OR REPLACE FUNCTION liveness.members_listen()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', members_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_members';
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.members_unlisten()
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    EXECUTE pg_catalog.format('UNLISTEN %I', members_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_members';
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.note_alive_lock_expected()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO alive_lock_expectations AS e (shard, generation)
    VALUES (pg_catalog.uuid_hash(NEW.instance_id) & 63, 1)
    ON CONFLICT (shard) DO UPDATE SET generation = e.generation + 1;
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.notify_dead_instances(p_ids uuid[])
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_channel  text := events_channel();
    v_members  text := members_channel();
    v_started  timestamptz := pg_catalog.pg_postmaster_start_time();
    v_id       uuid;
    v_lease    text;
    v_notified timestamptz;
    v_stamped  boolean;
BEGIN
    FOR v_id IN SELECT DISTINCT u FROM pg_catalog.unnest(p_ids) u LOOP
        IF coalesce((SELECT s.alive FROM instance_state_verdicts(p_instance_id => v_id) s), false) THEN
            CONTINUE;
        END IF;
        -- The current stamp's row, locked: two watchers that ask at once notify it once.
        SELECT true, a.notified_at INTO v_stamped, v_notified
          FROM alive_lock_absences a
          JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
         WHERE a.instance_id = v_id AND a.server_started_at = v_started
           FOR UPDATE OF a;
        IF v_notified IS NOT NULL THEN
            RETURN NEXT v_id;
            CONTINUE;
        END IF;
        IF v_stamped THEN
            UPDATE alive_lock_absences a SET notified_at = pg_catalog.clock_timestamp() WHERE a.instance_id = v_id;
        END IF;
        PERFORM history_note_dead(v_id);
        PERFORM pg_catalog.pg_notify(v_members, 'dead:' || v_id::text);
        FOR v_lease IN SELECT l.name FROM leases l
                        WHERE l.holder_instance_id = v_id AND l.expires_at >= pg_catalog.now() AND event_fits('free:' || l.name) LOOP
            PERFORM pg_catalog.pg_notify(v_channel, 'free:' || v_lease);
        END LOOP;
        RETURN NEXT v_id;
    END LOOP;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.notify_instance_event()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_missing timestamptz;
    v_dead    timestamptz;
    v_last    timestamptz;
    v_how     text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_notify(members_channel(), 'left:' || OLD.instance_id::text);
        SELECT a.missing_since INTO v_missing FROM alive_lock_absences a
         WHERE a.instance_id = OLD.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
           AND a.lock_pid IS NOT DISTINCT FROM OLD.lock_pid;
        SELECT d.last_alive_at, d.dead_at, d.how INTO v_last, v_dead, v_how
          FROM history_death_times(OLD.holds_alive_lock,
                   EXISTS (SELECT 1 FROM bigint_advisory_locks l
                            WHERE l.granted AND l.classid = OLD.lock_classid AND l.objid = OLD.lock_objid
                              AND (OLD.lock_pid IS NULL OR l.pid = OLD.lock_pid)),
                   OLD.last_heartbeat_at, v_missing, OLD.lock_grace, OLD.stale_threshold, OLD.definitive_dead_cutoff) d;
        IF v_dead <= pg_catalog.now() THEN
            INSERT INTO history (at, kind, instance_id, host, service, how, since, dead_at)
            VALUES (v_dead, 'dead', OLD.instance_id, OLD.host_name, OLD.service_name, v_how, v_last, v_dead)
            ON CONFLICT (instance_id, since) WHERE kind = 'dead' DO NOTHING;
            INSERT INTO history (at, kind, instance_id, host, service, since)
            VALUES (pg_catalog.clock_timestamp(), 'reaped', OLD.instance_id, OLD.host_name, OLD.service_name, v_last);
        ELSE
            INSERT INTO history (at, kind, instance_id, host, service, since)
            VALUES (pg_catalog.clock_timestamp(), 'left', OLD.instance_id, OLD.host_name, OLD.service_name, OLD.started_at);
        END IF;
    ELSE
        PERFORM pg_catalog.pg_notify(members_channel(), 'joined:' || NEW.instance_id::text);
        INSERT INTO history (at, kind, instance_id, host, service)
        VALUES (pg_catalog.clock_timestamp(), 'joined', NEW.instance_id, NEW.host_name, NEW.service_name);
    END IF;
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.notify_lease_free()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_payload pg_catalog.text := 'free:' OPERATOR(pg_catalog.||) OLD.name;
    v_reason  pg_catalog.text := pg_catalog.current_setting('pg_liveness.end_reason', true);
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM liveness.event_channels c), v_payload);
    END IF;
    IF v_reason OPERATOR(pg_catalog.=) '' THEN
        v_reason := NULL;
    END IF;
    INSERT INTO liveness.history (at, kind, lease_name, epoch, instance_id, host, how, reason, since)
    VALUES (pg_catalog.clock_timestamp(), 'ended', OLD.name, OLD.epoch, OLD.holder_instance_id, OLD.holder_host,
            CASE WHEN v_reason IS NULL THEN 'released' ELSE 'stepped_down' END, pg_catalog.left(v_reason, 64), OLD.taken_at);
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.notify_lease_taken()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_payload pg_catalog.text := 'taken:' OPERATOR(pg_catalog.||) NEW.name;
    v_how     pg_catalog.text;
    v_since   pg_catalog.timestamptz;
    v_dead    pg_catalog.timestamptz;
    v_began   pg_catalog.timestamptz;
    v_epoch   pg_catalog.int8;
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM liveness.event_channels c), v_payload);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        IF OLD.expires_at OPERATOR(pg_catalog.<) NEW.taken_at OR OLD.holder_instance_id IS NULL THEN
            v_how := 'expired';
            v_since := OLD.expires_at;
        ELSE
            v_how := 'holder_dead';
            PERFORM liveness.history_note_dead(OLD.holder_instance_id);
            SELECT h.since, h.dead_at INTO v_since, v_dead FROM liveness.history h
             WHERE h.instance_id OPERATOR(pg_catalog.=) OLD.holder_instance_id AND h.kind OPERATOR(pg_catalog.=) 'dead'
             ORDER BY h.id DESC LIMIT 1;
        END IF;
        -- A leadership ends no earlier than it began: a holder may take a lease after its
        -- last sign of life by the rule (its lock stamped vanished, within the grace) and
        -- then be called dead. Its acquisition is the latest of the lease's (this one's
        -- is written below): one row, read backwards on the lease's index.
        SELECT h.at, h.epoch INTO v_began, v_epoch FROM liveness.history h
         WHERE h.lease_name OPERATOR(pg_catalog.=) OLD.name AND h.kind OPERATOR(pg_catalog.=) 'acquired'
         ORDER BY h.at DESC LIMIT 1;
        IF v_epoch IS NULL OR v_epoch OPERATOR(pg_catalog.<>) OLD.epoch THEN
            v_began := OLD.taken_at;
        END IF;
        v_since := greatest(least(coalesce(v_since, NEW.taken_at), NEW.taken_at), v_began);
        INSERT INTO liveness.history (at, kind, lease_name, epoch, instance_id, host, how, since, dead_at)
        VALUES (v_since, 'ended', OLD.name, OLD.epoch,
                OLD.holder_instance_id, OLD.holder_host, v_how, OLD.taken_at, v_dead);
    ELSE
        SELECT h.at INTO v_since FROM liveness.history h
         WHERE h.lease_name OPERATOR(pg_catalog.=) NEW.name AND h.kind OPERATOR(pg_catalog.=) 'ended'
         ORDER BY h.at DESC LIMIT 1;
        v_how := CASE WHEN v_since IS NULL THEN 'free' ELSE 'released' END;
    END IF;
    INSERT INTO liveness.history (at, kind, lease_name, epoch, instance_id, host, how, since, dead_at)
    VALUES (pg_catalog.clock_timestamp(), 'acquired', NEW.name, NEW.epoch, NEW.holder_instance_id, NEW.holder_host, v_how, v_since, v_dead);
    RETURN NULL;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.stamp_alive_lock_absences(p_instance_id uuid DEFAULT NULL::uuid)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
 SET plan_cache_mode TO 'force_custom_plan'
 SET jit TO 'off'
AS $function$
DECLARE
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz;
    v_ids     uuid[];
    v_pids    integer[];
    v_missing integer;
BEGIN
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on'
       OR NOT caller_participates() THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(pg_catalog.array_agg(i.instance_id), '{}'), coalesce(pg_catalog.array_agg(i.lock_pid), '{}')
      INTO v_ids, v_pids
      FROM instances i
      LEFT JOIN (SELECT DISTINCT l.classid, l.objid, l.pid FROM bigint_advisory_locks l WHERE l.granted) k
             ON k.classid = i.lock_classid AND k.objid = i.lock_objid
            AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)
     WHERE i.holds_alive_lock AND k.classid IS NULL
       AND (p_instance_id IS NULL OR i.instance_id = p_instance_id);
    v_now := pg_catalog.clock_timestamp(); -- after the read: each lock stamped vanished before it
    WITH missing AS (
        SELECT m.instance_id, m.lock_pid FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_pids)) AS m(instance_id, lock_pid)),
    stamped AS (
        INSERT INTO alive_lock_absences AS a (instance_id, missing_since, server_started_at, lock_pid)
        SELECT m.instance_id, v_now, v_started, m.lock_pid FROM missing m
         WHERE NOT EXISTS (SELECT 1 FROM alive_lock_absences k
                            WHERE k.instance_id = m.instance_id AND k.server_started_at = v_started
                              AND k.lock_pid IS NOT DISTINCT FROM m.lock_pid)
        -- A stamp of an earlier server or lock session is replaced, unnotified; one of this
        -- very lock, committed by a concurrent stamper after this one's read, is kept as it
        -- is: its earlier time stands, and the vanishing is recorded once.
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at,
               lock_pid = excluded.lock_pid, notified_at = NULL
         WHERE a.server_started_at IS DISTINCT FROM excluded.server_started_at
            OR a.lock_pid IS DISTINCT FROM excluded.lock_pid
        RETURNING a.instance_id),
    stamped_noted AS (
        INSERT INTO history (at, kind, instance_id)
        SELECT v_now, 'lock_vanished', s.instance_id FROM stamped s
        RETURNING 1),
    cleared AS (
        DELETE FROM alive_lock_absences a
         WHERE (p_instance_id IS NULL OR a.instance_id = p_instance_id)
           AND NOT EXISTS (SELECT 1 FROM missing m WHERE m.instance_id = a.instance_id)
        RETURNING a.instance_id, a.missing_since, a.server_started_at),
    cleared_noted AS (
        INSERT INTO history (at, kind, instance_id, host, service, since)
        SELECT v_now, 'lock_back', c.instance_id, i.host_name, i.service_name, c.missing_since
          FROM cleared c JOIN instances i ON i.instance_id = c.instance_id AND i.holds_alive_lock
         WHERE c.server_started_at = v_started
        RETURNING 1)
    SELECT count(*) INTO v_missing FROM missing;
    RETURN v_missing;
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.stamp_alive_lock_absences_seen(p_seen_lost uuid[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF coalesce(cardinality(p_seen_lost), 0) = 0 AND NOT EXISTS (SELECT 1 FROM alive_lock_absences) THEN
        RETURN 0;
    END IF;
    RETURN stamp_alive_lock_absences(NULL::uuid);
END
$function$
;

CREATE OR REPLACE FUNCTION liveness.watch_alive_locks(p_digest text)
 RETURNS TABLE(digest text, instance_id uuid, dead_in double precision)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'liveness', 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_head    text;
    v_locks   integer;
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz := pg_catalog.clock_timestamp();
    v_since   timestamptz;
    v_expects text;
BEGIN
    -- The generation of the locks the rows expect, read before the locks held: a row
    -- names a lock session only once that session holds the lock (the claim records it;
    -- a beat reports it after the claim), so a lock expected by the next reading and not
    -- by this one was held before the next reading of the locks, and is either in it or
    -- missing from it: either way the next tick sees what to stamp.
    SELECT sum(e.generation)::text INTO v_expects FROM alive_lock_expectations e;
    SELECT count(*)::integer, count(*)::text || ':' || coalesce(bit_xor(k.key), 0)::text || ':' || coalesce(sum(k.key), 0)::text
           || '/' || v_expects
      INTO v_locks, v_head
      FROM (SELECT ((l.classid::bigint << 32) | l.objid::bigint) # (l.pid::bigint * 2654435761) AS key
              FROM bigint_advisory_locks l
             WHERE l.granted AND l.mode = 'ExclusiveLock') k;
    digest := v_head || '/' || alive_lock_absences_digest();
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT w.watched_at INTO v_since FROM alive_lock_watch w;
    v_since := greatest(coalesce(v_since, v_now), v_now - interval '1 minute');
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at <= v_now AND l.expires_at > v_since AND event_fits('free:' || l.name);
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at > v_now AND l.holder_instance_id IS NOT NULL AND event_fits('free:' || l.name)
        AND NOT coalesce(instance_watched_alive(l.holder_instance_id), false);
    UPDATE alive_lock_watch w
       SET watched_at = greatest(w.watched_at, v_now), server_started_at = v_started, lock_count = v_locks;
    IF NOT FOUND THEN
        INSERT INTO alive_lock_watch AS w (singleton, watched_at, server_started_at, lock_count)
        VALUES (true, v_now, v_started, v_locks)
        ON CONFLICT (singleton) DO UPDATE
           SET watched_at = greatest(w.watched_at, excluded.watched_at), server_started_at = excluded.server_started_at,
               lock_count = excluded.lock_count;
    END IF;
    IF digest IS NOT DISTINCT FROM p_digest THEN
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM stamp_alive_lock_absences(NULL::uuid);
    digest := v_head || '/' || alive_lock_absences_digest();
    RETURN NEXT;
    RETURN QUERY
        SELECT digest, a.instance_id,
               extract(epoch FROM a.missing_since + coalesce(i.lock_grace, interval '1 second') - pg_catalog.now())::float8
          FROM alive_lock_absences a
          JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
         WHERE a.server_started_at = v_started AND a.notified_at IS NULL AND i.holds_alive_lock;
END
$function$
;
