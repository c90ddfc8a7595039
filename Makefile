# fusebox — see README.md. Every target works on a fresh Debian machine with Go.
GO        ?= go
PKGS      := ./...
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME  ?= 30s

PROTOC_GEN_GO := bin/protoc-gen-go

.PHONY: proto build run test test-short bench bench-peers bench-wire fuzz lint fmt e2e demo clean soak soak-short bench-replicas

# The binary says what it was built from: `bin/extproc version`.
MAINLIB   := github.com/fusebox-llm/fusebox/cmd/extproc/mainlib
LDFLAGS   := -X $(MAINLIB).Commit=$(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty) \
             -X $(MAINLIB).BuildDate=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/extproc ./cmd/extproc

# Regenerates the replica schema's Go (proto/replica/v1) with Debian's protoc
# (protobuf-compiler) and the protoc-gen-go of go.mod's protobuf module.
proto:
	$(GO) build -o $(PROTOC_GEN_GO) google.golang.org/protobuf/cmd/protoc-gen-go
	protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --proto_path=proto --go_out=proto --go_opt=paths=source_relative proto/replica/v1/replica.proto

# The built binary, not `go run`: a signal to the process make starts
# reaches fusebox itself (killing a `go run` left the server running).
run: build
	exec ./bin/extproc $(ARGS)

# The whole suite (test/suite.sh): vet, then every test with the race
# detector, replay's memory bound without it (a test of size), the poison
# build, the e2e suite on the observer profile, then
# the modules kept apart from the product's go.mod (compose validation, the
# operations kit checked with Prometheus's and Kubernetes' own parsers, the
# dashboard in Chromium, peer benchmarks). Every step runs whatever the
# ones before it did, and the run ends with a summary naming each failed
# step. The race runs' results go through test/skipreport, which ends with
# every skipped test and its reason (a missing tool skips outside CI) and
# the slowest tests.
test:
	GO=$(GO) PKGS='$(PKGS)' ./test/suite.sh

# See fusebox route around an outage and recover, without Envoy (about 45 s).
demo:
	$(GO) run ./test/e2e/demo

test-short:
	$(GO) test -short -count=1 $(PKGS)

# End-to-end scenarios: fusebox behind the Envoy-playing proxy, fake providers.
e2e:
	$(GO) test -race -count=1 ./test/e2e/...

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Runs every fuzz target for FUZZTIME each.
fuzz:
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin

# The cost Envoy sees: fusebox in its own process against a null CONTINUE
# server, full lifecycles over gRPC, 32 concurrent streams (test/wirebench).
bench-wire:
	$(GO) build -o bin/extproc ./cmd/extproc
	$(GO) build -o bin/nullproc ./test/wirebench/nullproc
	$(GO) run ./test/wirebench -fusebox bin/extproc -null bin/nullproc
	$(GO) run ./test/wirebench -fusebox bin/extproc -null bin/nullproc -transports -requests 1000
	FUSEBOX_FIGURES=1 $(GO) test -count=1 -v -run TestProfileFigures ./test/e2e/ | grep profile_figures

# The soak and fault campaign (test/soak): 200,000 paced requests with the
# fault schedule; SOAK_ARGS adds flags (e.g. -requests 900000 for 30 min).
soak:
	$(GO) run ./test/soak $(SOAK_ARGS)

# Its short profile (also run by make test, as TestSoakShort).
soak-short:
	$(GO) test -count=1 -run TestSoakShort -v ./test/soak

# The replica view's hidden cost, against a real redis-server on loopback:
# the decision on the Redis store's local view against the memory store's
# (same run), and transition propagation between two replicas through the
# feed, p50/p99 over 2,000 transitions.
bench-replicas:
	$(GO) test -run '^$$' -bench 'Decide' -count 3 ./pkg/breaker/redisstore
	$(GO) test -run '^$$' -bench 'TransitionPropagation' -benchtime 1000x ./pkg/breaker/redisstore
	FUSEBOX_FIGURES=1 $(GO) test -count=1 -v -run 'TestFaultFigures|TestSlowRedisLosesNoOutcome|TestFleetCostFigures' ./pkg/breaker/redisstore | grep -E 'figures_test|slow_test|fleetcost_test'
	FUSEBOX_FIGURES=1 $(GO) test -count=1 -v -run TestHeldHeapFigures ./pkg/processor | grep figures

# Peer comparison (sony/gobreaker) in its own module so the product's go.mod stays clean.
bench-peers:
	cd test/bench && $(GO) test -run '^$$' -bench . -benchmem -count 3 .
