package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
)

// serveMetrics serves the agent collector of pg_liveness_exporter for in on addr's
// /metrics, and returns the function that stops serving.
func serveMetrics(addr string, in *instance, logger *slog.Logger) (stop func(), err error) {
	cfg := collector.DefaultConfig()
	cfg.Instances.Enabled, cfg.Leases.Enabled, cfg.AdvisoryLocks.Enabled, cfg.Statements.Enabled = false, false, false, false
	// The pool only for the database's identity (pg_liveness_database_info), which the
	// two-leaders alert meets this agent's lease beliefs by: no collector reads through it.
	exp, err := collector.New(cfg, in.pool, in, logger.With("component", "metrics"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--web.listen-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", exp.Handler(nil))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics server stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
