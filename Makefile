# pg_liveness_exporter — see README.md.
GO          ?= go
BINARY      ?= pg_liveness_exporter
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_FLAGS  ?= -race -count=1 -timeout 30m

.PHONY: all build test lint run bench clean faults

all: lint test build

build:
	$(GO) build -o $(BINARY) .

# The whole suite, against real PostgreSQL, PgBouncer, Prometheus and Alertmanager that
# the tests start themselves on 127.0.0.1.
test:
	$(GO) test $(TEST_FLAGS) ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# The local demo: PostgreSQL in .run/, the exporter as an agent, a simulated fleet and,
# if installed, Prometheus with the alert rules. Ctrl-C stops it all. See scripts/run.sh
# for the PG_LIVENESS_* overrides.
run:
	GO=$(GO) ./scripts/run.sh

# The fault suite: every scenario FAULT_TRIALS times (default 10), then docs/failover.md
# is rewritten from the measurements. Needs root for the network-namespace scenarios.
faults:
	$(GO) test -count=1 -timeout 60m ./internal/faults/ -args -faults.trials=$${FAULT_TRIALS:-10} -faults.report=$(CURDIR)/docs/failover.md

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...

clean:
	rm -f $(BINARY)
