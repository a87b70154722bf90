-- compatible-from: 1
-- Each instance's alive-lock key halves, stored with the row, so that matching pg_locks
-- against every instance (the exporter does it on every scrape) joins on plain columns
-- instead of hashing every id again. instance_lock_key stays the one definition of the
-- key: these columns are generated from it.

ALTER TABLE instances
    ADD COLUMN lock_classid oid GENERATED ALWAYS AS (lock_key_classid(instance_lock_key(instance_id))) STORED,
    ADD COLUMN lock_objid   oid GENERATED ALWAYS AS (lock_key_objid(instance_lock_key(instance_id))) STORED;

CREATE OR REPLACE VIEW instance_alive_locks AS
SELECT i.instance_id, l.pid
  FROM instances i
  JOIN bigint_advisory_locks l
    ON l.granted
   AND l.classid = i.lock_classid
   AND l.objid = i.lock_objid;
