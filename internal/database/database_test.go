package database

import (
	"errors"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/store"
)

// A pool configuration the pool cannot work with is refused before anything connects,
// with a *store.ConfigError naming the PoolConfig field (the binary maps it to its flag).
func TestPoolConfigErrorsNameTheField(t *testing.T) {
	const dsn = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable"
	for _, c := range []struct {
		cfg   PoolConfig
		field string
	}{
		{PoolConfig{DSN: dsn, MaxConns: 0, ConnectTimeout: time.Second}, "PoolConfig.MaxConns"},
		{PoolConfig{DSN: dsn, MaxConns: MaxMaxConns + 1, ConnectTimeout: time.Second}, "PoolConfig.MaxConns"},
		{PoolConfig{DSN: dsn, MaxConns: 1, ConnectTimeout: 0}, "PoolConfig.ConnectTimeout"},
		{PoolConfig{DSN: dsn, MaxConns: 1, ConnectTimeout: -time.Second}, "PoolConfig.ConnectTimeout"},
	} {
		pool, err := NewPool(c.cfg)
		if pool != nil {
			pool.Close()
		}
		var ce *store.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("NewPool(MaxConns %d, ConnectTimeout %s): %v; want a *store.ConfigError naming %s",
				c.cfg.MaxConns, c.cfg.ConnectTimeout, err, c.field)
		}
	}
	pool, err := NewPool(PoolConfig{DSN: dsn, MaxConns: MaxMaxConns, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatalf("the largest pool is refused: %v", err)
	}
	pool.Close()
}
