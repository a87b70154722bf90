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

FROM golang:1.26-trixie AS build
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

FROM gcr.io/distroless/static-debian13:nonroot
COPY --from=build /out/pg_liveness_exporter /pg_liveness_exporter
USER 65532:65532
EXPOSE 9816
ENTRYPOINT ["/pg_liveness_exporter"]
