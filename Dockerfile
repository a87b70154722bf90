# syntax=docker/dockerfile:1
# pg_liveness_exporter: a static binary on a distroless base, run as a non-root user,
# with no shell in the image. The version is stamped as `make build` does:
#
#   docker build \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg BRANCH=$(git rev-parse --abbrev-ref HEAD) \
#     --build-arg BUILD_USER=$(id -un)@$(hostname) \
#     --build-arg BUILD_DATE=$(date -u +%Y%m%d-%H:%M:%S) \
#     -t pg_liveness_exporter .

# The bases are pinned by digest, so that a build is the same build tomorrow. No registry
# was reachable where these were pinned, so they could not be checked against it: they
# are the digests other public projects pin for the same tags. Check and update both
# before a release, with a machine that reaches the registries:
#   crane digest golang:1.26-trixie
#   crane digest gcr.io/distroless/static-debian13:nonroot
# (or docker buildx imagetools inspect IMAGE); deploy/dockerfile_test.go requires a digest.
# make image builds the same image without an engine, reproducibly (README: Container image).
FROM golang:1.26-trixie@sha256:87ffdb09b6a2e29ff910748b745395e8a0299aa80b7c0551cdca9b55e3fd2b3e AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=unknown
ARG REVISION=unknown
ARG BRANCH=unknown
ARG BUILD_USER=unknown
ARG BUILD_DATE=unknown
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
# The Makefile holds the one definition of the version flags.
RUN make build BINARY=/out/pg_liveness_exporter \
      VERSION="${VERSION}" REVISION="${REVISION}" BRANCH="${BRANCH}" \
      BUILD_USER="${BUILD_USER}" BUILD_DATE="${BUILD_DATE}"

FROM gcr.io/distroless/static-debian13:nonroot@sha256:1c2c046bc09ed40fad370b599a0b1ae7987f55b01e247cf27a7c27cd97e5bbc7
COPY --from=build /out/pg_liveness_exporter /pg_liveness_exporter
USER 65532:65532
EXPOSE 9816
ENTRYPOINT ["/pg_liveness_exporter"]
