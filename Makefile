# credbroker: `make run` starts the development stack, `make test` runs every check.
GO ?= go
DATA ?= ./data

.PHONY: run test build vet fmt-check unit bench clean

run:
	$(GO) run ./cmd/broker dev --data $(DATA)

build:
	$(GO) build -o bin/broker ./cmd/broker

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 20m ./...

test: fmt-check vet unit

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./vault/...

clean:
	rm -rf bin
