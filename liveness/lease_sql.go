package liveness

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
)

// Lease statements. Every time comes from now() on the server; the client only sends the
// ttl in seconds. Each statement runs on a pool connection borrowed for that statement
// alone.

// leaseAcquireSQL inserts the row, or takes it over only when it has expired by the
// database clock. ON CONFLICT DO UPDATE decides atomically, so two callers can never both
// get a row back. The SELECT yields no row while the lease is held, so a refused attempt
// draws no epoch: epochs count acquisitions (only racing attempts on an expired lease
// waste one), and the common "held by another" answer takes no row lock.
//
// A lease whose holder instance is dead by the one verdict (is_instance_alive) is free
// as well, so a crashed holder's lease moves without waiting for its ttl; and an
// acquirer that names its instance takes the lease only while that instance is alive by
// the same verdict, so that its own death is visible to the others.
//
// $1 name, $2 holder, $3 ttl in seconds, $4 the holder's instance id (or NULL), $5 its
// host.
const leaseAcquireSQL = `INSERT ` + sqltag.LeaseAcquire + ` INTO {schema}.leases AS l
       (name, holder, holder_instance_id, holder_host, epoch, taken_at, expires_at)
SELECT $1, $2, $4::uuid, $5::text, nextval({epoch_seq}), now(), now() + make_interval(secs => $3::float8)
 WHERE {schema}.lease_is_free($1)
   AND ($4::uuid IS NULL OR {schema}.is_instance_alive($4::uuid))
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, holder_instance_id = excluded.holder_instance_id, holder_host = excluded.holder_host,
       epoch = excluded.epoch, taken_at = excluded.taken_at, expires_at = excluded.expires_at
 WHERE l.expires_at < now()
    OR (l.holder_instance_id IS NOT NULL AND NOT {schema}.is_instance_alive(l.holder_instance_id))
RETURNING l.epoch, l.taken_at, l.expires_at`

// leaseLeaderSQL reads who holds a lease. $1 name.
const leaseLeaderSQL = `SELECT ` + sqltag.LeaseLeader + ` l.holder_instance_id, coalesce(l.holder_host, ''), l.epoch,
       l.taken_at, l.expires_at, l.expires_at >= now(),
       l.holder_instance_id IS NULL OR {schema}.is_instance_alive(l.holder_instance_id)
  FROM {schema}.leases l WHERE l.name = $1`

// leaseRenewSQL extends the lease only while this very acquisition (name, holder and
// epoch) still holds it and it has not expired by the database clock. Matching on name
// and holder alone lets a stale process renew a lease it has lost; the expiry guard stops
// a late renewal from resurrecting an expired lease before someone else takes it.
//
// $1 name, $2 holder, $3 epoch, $4 ttl in seconds.
const leaseRenewSQL = `UPDATE ` + sqltag.LeaseRenew + ` {schema}.leases
   SET expires_at = now() + make_interval(secs => $4::float8)
 WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at >= now()
RETURNING expires_at`

// leaseReleaseSQL deletes the row only if it still belongs to this acquisition, so a late
// release never deletes a newer holder's lease.
//
// $1 name, $2 holder, $3 epoch.
const leaseReleaseSQL = `DELETE ` + sqltag.LeaseRelease + ` FROM {schema}.leases
 WHERE name = $1 AND holder = $2 AND epoch = $3`

// leaseAbandonSQL deletes the row an acquisition may have inserted when its answer was
// lost: the holder token is new on every acquisition, so it matches nothing else.
//
// $1 name, $2 holder.
const leaseAbandonSQL = `DELETE ` + sqltag.LeaseRelease + ` FROM {schema}.leases
 WHERE name = $1 AND holder = $2`

// leaseFenceSQL runs inside the caller's transaction: lease_is_held locks the lease row
// FOR SHARE until that transaction ends, so no takeover commits in between.
//
// $1 name, $2 epoch.
const leaseFenceSQL = `SELECT ` + sqltag.LeaseFence + ` {schema}.lease_is_held($1, $2)`

// leaseDetachSQL leaves a lease to expire: without a holder instance, lease_is_free no
// longer frees it when that instance is dead, only once it expires. Guarded like the
// release, so it never touches a newer holder's row. Tagged as a release: it is how a
// holder lets a lease go when it may not delete it yet.
//
// $1 name, $2 holder, $3 epoch.
const leaseDetachSQL = `UPDATE ` + sqltag.LeaseRelease + ` {schema}.leases SET holder_instance_id = NULL
 WHERE name = $1 AND holder = $2 AND epoch = $3`

// leaseStatements are the lease statements rendered for one schema.
type leaseStatements struct {
	acquire, renew, release, abandon, leader, fence, detach string
}

func newLeaseStatements(schema string) leaseStatements {
	if schema == "" {
		schema = DefaultSchema
	}
	// nextval takes the sequence as a regclass literal: the quoted identifier inside a
	// string literal, with the literal's own quotes doubled. One pass renders both
	// placeholders (as sqlFor does for {schema}), so neither can appear inside the other.
	ident := pgx.Identifier{schema}.Sanitize()
	seq := "'" + strings.ReplaceAll(ident+".lease_epoch_seq", "'", "''") + "'"
	render := strings.NewReplacer("{schema}", ident, "{epoch_seq}", seq).Replace
	return leaseStatements{
		acquire: render(leaseAcquireSQL),
		renew:   render(leaseRenewSQL),
		release: render(leaseReleaseSQL),
		abandon: render(leaseAbandonSQL),
		leader:  render(leaseLeaderSQL),
		fence:   render(leaseFenceSQL),
		detach:  render(leaseDetachSQL),
	}
}
