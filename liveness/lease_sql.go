package liveness

import (
	"strings"

	"github.com/jackc/pgx/v5"
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
// $1 name, $2 holder, $3 ttl in seconds.
const leaseAcquireSQL = `/* pg_liveness:lease_acquire */ INSERT INTO {schema}.leases AS l (name, holder, epoch, taken_at, expires_at)
SELECT $1, $2, nextval({epoch_seq}), now(), now() + make_interval(secs => $3::float8)
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.leases h WHERE h.name = $1 AND h.expires_at >= now())
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, epoch = excluded.epoch, taken_at = excluded.taken_at, expires_at = excluded.expires_at
 WHERE l.expires_at < now()
RETURNING l.epoch, l.taken_at, l.expires_at`

// leaseRenewSQL extends the lease only while this very acquisition (name, holder and
// epoch) still holds it and it has not expired by the database clock. Matching on name
// and holder alone lets a stale process renew a lease it has lost; the expiry guard stops
// a late renewal from resurrecting an expired lease before someone else takes it.
//
// $1 name, $2 holder, $3 epoch, $4 ttl in seconds.
const leaseRenewSQL = `/* pg_liveness:lease_renew */ UPDATE {schema}.leases
   SET expires_at = now() + make_interval(secs => $4::float8)
 WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at >= now()
RETURNING expires_at`

// leaseReleaseSQL deletes the row only if it still belongs to this acquisition, so a late
// release never deletes a newer holder's lease.
//
// $1 name, $2 holder, $3 epoch.
const leaseReleaseSQL = `/* pg_liveness:lease_release */ DELETE FROM {schema}.leases
 WHERE name = $1 AND holder = $2 AND epoch = $3`

// leaseStatements are the lease statements rendered for one schema.
type leaseStatements struct {
	acquire, renew, release string
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
	}
}
