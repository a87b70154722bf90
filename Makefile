# pg_liveness_exporter — see README.md.
GO          ?= go
BINARY      ?= pg_liveness_exporter
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# make test runs without go test's own vet pass (make lint runs go vet, and staticcheck,
# over the three modules): it type-checked every package a second time while the suite
# built.
TEST_FLAGS  ?= -race -vet=off -count=1 -timeout 30m

# The version in pg_liveness_exporter_build_info and --version, from git. The Dockerfile
# runs `make build` with these passed as build arguments.
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
REVISION   ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BRANCH     ?= $(shell git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)
BUILD_USER ?= $(shell id -un 2>/dev/null || echo unknown)@$(shell hostname 2>/dev/null || echo unknown)
BUILD_DATE ?= $(shell date -u +%Y%m%d-%H:%M:%S)
VERSION_PKG := github.com/prometheus/common/version
LDFLAGS := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION) \
	-X $(VERSION_PKG).Branch=$(BRANCH) -X $(VERSION_PKG).BuildUser=$(BUILD_USER) \
	-X $(VERSION_PKG).BuildDate=$(BUILD_DATE)

.PHONY: all build image test test-majors test-stress lint run bench records $(RECORDS) bench-compare bench-discovery bench-fleet clean deps faults faults-majors dashboard-plots soak

all: lint test build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BINARY) .

# The OCI image, without a container engine (deploy/internal/image): one image index of
# IMAGE_PLATFORMS, each the static, stripped binary (CGO_ENABLED=0, -trimpath, -s -w) as
# user 65532 with its SPDX SBOM attached as BuildKit attaches one, written to
# $(IMAGE_DIR)/oci (an OCI image layout: push it with crane, skopeo or oras, see README:
# Container image; the release workflow does on a v* tag), $(IMAGE_DIR)/sbom/*.spdx.json
# and $(IMAGE_DIR)/image.tar (this machine's platform, docker load). Reproducible: the
# commit's time, not the clock's, so one commit gives one digest, which it prints.
# IMAGE_LICENSES is the licenses label, an SPDX expression; the repository declares none
# yet, so it is NOASSERTION until it does.
IMAGE_REPOSITORY ?= ghcr.io/pg-liveness/pg_liveness_exporter
IMAGE_TAG        ?= $(VERSION)
IMAGE_DIR        ?= $(CURDIR)/image
IMAGE_PLATFORMS  ?= linux/amd64,linux/arm64
IMAGE_LICENSES   ?= NOASSERTION
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	cd deploy && $(GO) run ./internal/buildimage -root .. -out $(IMAGE_DIR) \
		-repository $(IMAGE_REPOSITORY) -tag $(IMAGE_TAG) -version $(VERSION) -revision $(REVISION) \
		-branch $(BRANCH) -source-date-epoch $(SOURCE_DATE_EPOCH) -platforms $(IMAGE_PLATFORMS) \
		-licenses '$(IMAGE_LICENSES)'

# Installs the Debian packages the tests need when run as root; otherwise names them.
deps:
	./scripts/install-deps.sh test

# The PostgreSQL majors the database-facing tests run on besides Debian's 15 (the
# default), from npm's server builds that scripts/install-deps.sh installs; and those
# tests: every package whose outcome depends on the server, in the root module (DB_PKGS)
# and in the tools module (TOOLS_DB_PKGS, from tools/). On 15 every test runs; on the
# other majors make test leaves out (MAJOR_SKIP) the tests whose outcome does not depend
# on the server's major, which on 15 have already run:
#   - TestPrimaryFailover needs pg_basebackup, which the npm builds lack (as the soak,
#     tools/soak, does);
#   - bounds on the exporter's or the library's own scheduling and budgets, where the
#     server is only where statements wait: the discovery scale test (at 40 databases;
#     make bench-discovery runs 150), scrapes under status-page load, hung targets,
#     shutdown budgets, notification floods, trust windows under slow answers, a cut-off
#     leader's renewal, a join's first shares;
#   - what never reaches a server: the DSN fuzzing, the web config and secret reloads, a
#     SIGTERM during probes of a frozen server;
#   - the node agent's attach and re-attach, whose statements the other node agent tests
#     send;
#   - the history's reads and pruning at their bounds (a million rows of garbage for the
#     status page, a backlog for the collector, 120,000 rows to prune): the bound is a
#     LIMIT of the same statements the other history tests send on every major;
#   - tools/alerts and tools/statuspage (not in TOOLS_DB_PKGS): the rules' and the page's
#     behaviour depends on the exporter's metrics and state, whose SQL the root module's
#     tests run on every major.
# What these tests drive the server with (the agent's, the elector's and the collectors'
# statements, restarts, terminated backends) the tests kept on every major drive it with
# too. make test-majors runs the same selection; `go test` with PG_LIVENESS_TEST_PG_MAJOR
# set runs all of it on one major.
PG_MAJORS     ?= 14 16 17 18
DB_PKGS       := . ./collector ./internal/database ./internal/status ./internal/targets ./internal/testkit/pgtest ./liveness \
	./migrations ./internal/store ./internal/nodeagent ./internal/alivelock ./internal/lease
# The binary's package and the library's (. and ./liveness, the longest) run, besides 15,
# on the oldest and the newest major, where what differs between majors lies (README:
# Supported PostgreSQL majors); on 16 and 17 the rest of DB_PKGS runs, internal/store's
# check of every statement the product sends among them, and the fault suite's
# server-facing scenarios. internal/lifegate's 10,000 schedules run on 15: the verdict
# rule they evaluate is the one every verdict of the other tests evaluates on each major.
# make test-majors runs the binary's and the library's packages on every major too.
PG_MAJORS_LIBRARY ?= 14 18
TOOLS_DB_PKGS := ./cmd/fleetsim ./faults ./fleetsim
MAJOR_SKIP_TESTS := TestPrimaryFailover TestDiscoveryScrapesManyDatabasesWithinTheDeadline \
	TestScrapeLatencyUnderStatusPageLoad TestHungTargetsDoNotStarveHealthyOnes \
	TestProbeAnswersPerTargetAndIsolatesADownServer \
	FuzzDSNNeverLeaksPassword TestWebConfigReloadKeepsTheLastValidOne TestSecretSwapReloadsWithoutSignal \
	TestSIGTERMDuringProbesOfAFrozenServerExitsAtOnce \
	TestAgentShutdownWithinBudgetWhenStatementsHang TestAgentShutdownGivesEachStepItsBudget \
	TestNotificationFloodCostsAFollowerAtMostATryASecond TestLeaseTrustWindowEndsBeforeDatabaseExpiry \
	TestCutOffLeaderStepsDownDuringARenewal TestWatchAliveTellsAFailingReadOnce \
	TestShardsJoinOwnsItsShareSoonAfterProcessStart \
	TestNodeAgentLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce \
	TestNodeAgentOverTCPLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce \
	TestHistoryGarbageIsCountedAndBounded TestHistoryOfHundredsOfLeases TestHistoryBacklogIsReadInBoundedSteps \
	TestHistoryPruneIsBounded
empty :=
space := $(empty) $(empty)
MAJOR_SKIP    := ^($(subst $(space),|,$(strip $(MAJOR_SKIP_TESTS))))$$

# The fault suite's scenarios that make test runs on PG_MAJORS (on 15 it runs them all):
# those whose behaviour depends on the server, as make faults-majors runs them. A crash
# (kill -9) is seen through the server's lock table, a restart and a terminated backend
# are the server's doing; a partition, a hang or a pool's exhaustion behave alike on any
# major. make test runs each scenario once; make faults and make faults-majors run the
# full trials (FAULT_TRIALS).
MAJOR_FAULTS  := ^(TestCrash|TestRestartFast|TestRestartImmediate|TestTerminateBackend)$$

# make test's jobs run side by side, JOBS at a time (scripts/test.sh): most of the suite
# waits on timers and servers rather than computes: four at a time keep the two cores busy.
JOBS ?= 4
TEST_ENV = GO='$(GO)' TEST_FLAGS='$(TEST_FLAGS)' JOBS='$(JOBS)' PG_MAJORS='$(PG_MAJORS)' PG_MAJORS_LIBRARY='$(PG_MAJORS_LIBRARY)' DB_PKGS='$(DB_PKGS)' \
	TOOLS_DB_PKGS='$(TOOLS_DB_PKGS)' MAJOR_FAULTS='$(MAJOR_FAULTS)' MAJOR_SKIP='$(MAJOR_SKIP)'

# The whole suite, against real PostgreSQL, PgBouncer, Prometheus, Alertmanager and
# Chromium that the tests start themselves on 127.0.0.1: every package on 15 (the root
# module, deploy/ and tools/), the two-minute soak (alone), and the database-facing
# packages on PG_MAJORS. Every job runs even when one fails; at the end, a table of each
# package's seconds on each major. deploy/ and tools/ are modules of their own, so that
# the Kubernetes, BuildKit, Prometheus and chromedp libraries their tests use stay out of
# the binary's dependencies.
test: deps
	@$(TEST_ENV) ./scripts/test.sh all

# The timing-sensitive tests (the binary's, the library's, the gate's, the collectors'
# and the fault suite's make-test scenarios) with two busy processes beside them, as a
# busy machine would run them: a verdict that depends on the host's load fails here.
# About 15 minutes; not part of make test.
test-stress: deps
	@GO='$(GO)' TEST_FLAGS='$(TEST_FLAGS)' ./scripts/test-stress.sh

# The database-facing tests on each of PG_MAJORS (PG_MAJORS=18 for one).
test-majors:
	@$(TEST_ENV) ./scripts/test.sh majors

# gofmt, vet and staticcheck over the three modules (the tools module with the
# benchcompare build tag, so that the comparison's files are checked too).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd deploy && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	cd tools && $(GO) vet -tags benchcompare,benchfleet ./... && $(GO) run $(STATICCHECK) -tags benchcompare,benchfleet ./...

# The local demo: PostgreSQL in .run/, the exporter as an agent, a simulated fleet and,
# if installed, Prometheus with the alert rules. Ctrl-C stops it all. See scripts/run.sh
# for the PG_LIVENESS_* overrides.
run:
	GO=$(GO) ./scripts/run.sh

# Every dashboard panel's queries as PNG plots on Prometheus' graph page (headless
# Chromium), for docs/dashboards.md: against a running `make run` that has run for about ten
# minutes. A few minutes; not part of make test.
DASHBOARD_PLOTS_PROMETHEUS ?= http://127.0.0.1:9090
dashboard-plots:
	cd tools && $(GO) run ./cmd/dashboardplots -prometheus $(DASHBOARD_PLOTS_PROMETHEUS) -out $(CURDIR)/docs/dashboards -dashboards $(CURDIR)/dashboards

# The fault suite (tools/faults): every scenario FAULT_TRIALS times (default 10), then
# docs/failover.md is rewritten from the measurements, and so is every figure the other
# docs quote from it (tools/docquote; make test fails on a quote the report does not
# say). Needs root for the network-namespace scenarios.
faults:
	cd tools && $(GO) test -count=1 -timeout 60m ./faults/ -args -faults.trials=$${FAULT_TRIALS:-10} -faults.report=$(CURDIR)/docs/failover.md
	cd tools && $(GO) test -count=1 -run '^TestDocsQuoteTheFailoverReport$$' ./docquote/ -update

# The randomized fault soak (tools/soak): the fleet under a seeded nemesis for
# SOAK_DURATION, the history checked, the soak's section of docs/failover.md rewritten.
# SOAK_SEED replays a run's schedule; a failing run keeps its history (the path is
# printed). Needs root (network namespaces). The two-minute run with the fixed seed is
# part of make test, on PostgreSQL 15, alone (it adds about 130 s).
SOAK_DURATION ?= 30m
SOAK_SEED     ?= 29
SOAK_TIMEOUT  ?= 6h
soak:
	cd tools && $(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' -v ./soak/ \
		-args -soak.duration=$(SOAK_DURATION) -soak.seed=$(SOAK_SEED) -soak.report=$(CURDIR)/docs/failover.md

# The crash, restart and terminate scenarios (MAJOR_FAULTS) on other majors (FAULT_MAJORS,
# default 14 and 18), FAULT_TRIALS times each; each major's section of docs/failover.md is
# rewritten, the rest of the file kept.
FAULT_MAJORS ?= 14 18
faults-majors:
	./scripts/install-deps.sh test
	for m in $(FAULT_MAJORS); do \
		(cd tools && PG_LIVENESS_TEST_PG_MAJOR=$$m $(GO) test -count=1 -timeout 60m -run '$(MAJOR_FAULTS)' ./faults/ \
			-args -faults.trials=$${FAULT_TRIALS:-10} -faults.report=$(CURDIR)/docs/failover.md) || exit 1; \
	done

# Every benchmark of both modules (the fleet's heartbeat writes are in tools/fleetsim).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...
	cd tools && $(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...

# The run records the docs quote (docs/runs/<name>.txt, tools/cmd/runrecord): each target
# runs its benchmarks, keeps what they printed with the revision, date and machine, and
# rewrites every figure the docs quote from it; make test compares the quotes with the
# records. Run them on an otherwise idle machine: the fleet's takes about 25 minutes (it
# is make bench-fleet), the others about 10 together.
RECORDS = record-scrape-binary record-scrape-collectors record-heartbeat-writes record-leases record-fenced-write \
	record-history-writes record-watcher-tick record-lease-refused record-status-page \
	record-scrape-under-page-load record-collector-costs record-server-locks record-many-databases \
	record-shard-statements record-fleet
RUNRECORD = cd tools && $(GO) run ./cmd/runrecord
records: $(RECORDS)
record-scrape-binary:
	$(RUNRECORD) -name scrape-binary -- $(GO) test . -run '^$$' -bench '^BenchmarkExporterScrape$$' -count=1 -timeout 30m
record-scrape-collectors:
	$(RUNRECORD) -name scrape-collectors -- $(GO) test ./collector -run '^$$' -bench '^BenchmarkScrape$$' -benchtime=60x -benchmem -count=1 -timeout 30m
record-heartbeat-writes:
	$(RUNRECORD) -name heartbeat-writes -- $(GO) -C tools test ./fleetsim -run '^$$' -bench '^BenchmarkHeartbeatWrites$$' -count=1 -timeout 30m
record-leases:
	$(RUNRECORD) -name leases -- $(GO) test ./liveness -run '^$$' -bench 'BenchmarkSelect1|BenchmarkLease(AcquireRelease|Renew)$$|BenchmarkLeaseContention/' -count=1 -timeout 30m
record-fenced-write:
	$(RUNRECORD) -name fenced-write -- $(GO) test ./liveness -run '^$$' -bench 'BenchmarkSelect1/goroutines=1$$|BenchmarkFencedWrite' -benchtime=4000x -count=3 -timeout 30m
record-history-writes:
	$(RUNRECORD) -name history-writes -- $(GO) test ./liveness -run '^$$' -bench BenchmarkHistoryWrites -benchtime=30x -count=3 -timeout 30m
record-watcher-tick:
	$(RUNRECORD) -name watcher-tick -- $(GO) test ./liveness -run '^$$' -bench BenchmarkWatcherTick -benchtime=200x -count=1 -timeout 30m
record-lease-refused:
	$(RUNRECORD) -name lease-refused -- $(GO) test ./liveness -run '^$$' -bench 'BenchmarkLeaseAcquireRefused|BenchmarkAliveLockVerify' -benchtime=200x -count=1 -timeout 30m
record-status-page:
	$(RUNRECORD) -name status-page -- $(GO) test ./internal/status -run '^$$' -bench BenchmarkStatusPage -benchtime=50x -benchmem -count=1 -timeout 30m
record-scrape-under-page-load:
	$(RUNRECORD) -name scrape-under-page-load -- $(GO) test . -run '^$$' -bench BenchmarkScrapeUnderStatusPageLoad -benchtime=1x -count=1 -timeout 30m
record-collector-costs:
	$(RUNRECORD) -name collector-costs -- $(GO) test ./collector -run '^$$' -bench 'BenchmarkInstancesVerdictCost|BenchmarkWhizbangInstancesCost' -benchtime=60x -count=1 -timeout 30m
record-server-locks:
	$(RUNRECORD) -name server-locks -- $(GO) test ./collector -run '^$$' -bench 'BenchmarkAdvisoryLocksByServerLocks|BenchmarkDiscoveredServerScrape' -benchtime=50x -count=1 -timeout 30m
record-many-databases:
	$(RUNRECORD) -name many-databases -- $(GO) test . -run '^$$' -bench 'BenchmarkProbeManyDatabases|BenchmarkDiscoveryAgainstProbe' -benchtime=1x -count=1 -timeout 30m
record-shard-statements:
	$(RUNRECORD) -name shard-statements -- $(GO) test ./liveness -run '^$$' -bench BenchmarkShardMemberStatements -benchtime=1x -count=1 -timeout 30m
record-fleet:
	$(RUNRECORD) -name fleet -- $(MAKE) --no-print-directory bench-fleet FLEET_SIZES=$(FLEET_SIZES) FLEET_NODES=$(FLEET_NODES)

# What a fleet of agents at the library's defaults costs one PostgreSQL: 100 and 1,000
# agents each on a session of its own, then 100, 1,000 and 5,000 attached to 50 node
# agents (FLEET_SIZES, FLEET_NODES: the node agents of each run, 0 for none;
# FLEET_WARMUP, FLEET_MEASURE; FLEET_POOL, each agent's pool if smaller than 4):
# docs/performance.md, "Fleet scale". About 25 minutes. Run it on an otherwise idle
# machine. Above 1,000 agents they run in processes of their own, one per 1,000
# (FLEET_PROCESSES), so that their connections fit each process's open-files limit.
FLEET_SIZES ?= 100,1000,100,1000,5000
FLEET_NODES ?= 0,0,50,50,50
bench-fleet:
	./scripts/install-deps.sh test
	cd tools && FLEET_SIZES=$(FLEET_SIZES) FLEET_NODES=$(FLEET_NODES) FLEET_PLOT=$(CURDIR)/docs/fleet-scale.svg \
		$(GO) test -tags benchfleet -run '^TestBenchFleet$$' -count=1 -timeout 90m -v ./fleetbench/

# Side by side with Debian's prometheus-postgres-exporter (installed here, as root) at
# 1,000, 10,000 and 100,000 instances, interleaved; rewrites the table in
# docs/performance.md. About ten minutes; not part of make test.

bench-compare:
	./scripts/install-deps.sh bench
	cd tools && $(GO) test -tags benchcompare -run '^TestBenchCompare$$' -count=1 -timeout 30m -v ./benchcompare/ \
		-args -compare.report=$(CURDIR)/docs/performance.md $(BENCH_COMPARE_ARGS)

# Discovery at the 150 databases of one server its defaults promise, within the scrape's
# deadline (docs/many-databases.md); make test runs the same test at 40. A few minutes.
bench-discovery:
	PG_LIVENESS_DISCOVERY_DATABASES=150 $(GO) test -race -count=1 -timeout 20m -v \
		-run '^TestDiscoveryScrapesManyDatabasesWithinTheDeadline$$' .

clean:
	rm -f $(BINARY)
	rm -rf $(IMAGE_DIR)
