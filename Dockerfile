# syntax=docker/dockerfile:1
#
# credbroker container image: the static broker on an empty base (FROM
# scratch) with CA certificates and time zone data, running as the non-root
# user 65532, on a read-only root file system, with its bbolt store on the
# /data volume. There is no shell in the image.
#
# Two ways to build the same runtime stage (docs/DEPLOY.md):
#
#   docker build -t credbroker .            # or podman build: compiles in the
#                                           # `build` stage (pulls a Go image)
#   make image                              # nothing pulled: builds the root file
#                                           # system on the host, then replaces the
#                                           # `build` stage with it:
#                                           # podman build --build-context build=bin/image .
#
# Both run `make image-rootfs`, which writes the image's files to /rootfs and
# /data (bin/image/rootfs and bin/image/data on the host): rootfs/ holds broker,
# etc/ssl/certs, usr/share/zoneinfo, etc/passwd and etc/group naming the user
# 65532 and etc/credbroker/providers.yaml; data/ is the empty volume.

ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
# CA certificates and tzdata come from the builder's Debian packages.
RUN if [ ! -f /etc/ssl/certs/ca-certificates.crt ] || [ ! -f /usr/share/zoneinfo/UTC ]; then \
		apt-get update && apt-get install -y --no-install-recommends ca-certificates tzdata && rm -rf /var/lib/apt/lists/*; \
	fi
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Stamped into the binary (broker version, /healthz); empty: "devel"/"unknown".
ARG VERSION=""
ARG COMMIT=""
ARG BUILD_DATE=""
RUN make image-rootfs IMAGE_DIR=/ VERSION="$VERSION" COMMIT="$COMMIT" BUILD_DATE="$BUILD_DATE"

FROM scratch AS runtime
ARG VERSION=""
ARG COMMIT=""
ARG BUILD_DATE=""
COPY --from=build /rootfs/ /
# /data belongs to the broker's user, so a fresh volume mounted there
# (which starts as a copy of it) is writable without a root step.
COPY --from=build --chown=65532:65532 /data/ /data/
USER 65532:65532
ENV BROKER_ADDR=:8080 \
	BROKER_STORE=bolt:/data/broker.db \
	BROKER_PROVIDERS=/etc/credbroker/providers.yaml
VOLUME ["/data"]
EXPOSE 8080
LABEL org.opencontainers.image.title="credbroker" \
	org.opencontainers.image.description="Connects MCP tools to people's OAuth accounts without handing out the tokens" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${COMMIT}" \
	org.opencontainers.image.created="${BUILD_DATE}"
ENTRYPOINT ["/broker", "serve"]
