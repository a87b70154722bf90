-- compatible-from: 1
-- Older binaries keep working: this only adds an index.
--
-- Sharded ownership (Agent.Shards). A shard set's members and shards are leases: a member
-- holds "<set>/member/<instance id>" while it takes part, and the owner of a shard holds
-- "<set>/<shard>". Each member reads the set's live members, one range of lease names,
-- when the set changes: an index on the names in byte order answers that range in any
-- database collation (the primary key's order is the database's collation, in which a
-- prefix need not be one range).
CREATE INDEX leases_name_bytes_idx ON leases (name COLLATE "C");
