# syntax=docker/dockerfile:1
# fusebox: a static binary on distroless, as a non-root user.
#   docker build -t fusebox .                       (target fusebox, the default)
#   docker build --target fakeproviders -t fusebox-fakeproviders .
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# docker build --build-arg COMMIT=$(git rev-parse HEAD) --build-arg BUILD_DATE=$(date -u +%FT%TZ) .
ARG COMMIT=""
ARG BUILD_DATE=""
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/fusebox-llm/fusebox/cmd/extproc/mainlib.Version=${VERSION} -X github.com/fusebox-llm/fusebox/cmd/extproc/mainlib.Commit=${COMMIT} -X github.com/fusebox-llm/fusebox/cmd/extproc/mainlib.BuildDate=${BUILD_DATE}" -o /out/extproc ./cmd/extproc \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/fakeproviders ./test/e2e/cmd/fakeproviders

FROM gcr.io/distroless/static-debian12:nonroot AS fakeproviders
COPY --from=build /out/fakeproviders /fakeproviders
USER nonroot:nonroot
ENTRYPOINT ["/fakeproviders"]

FROM gcr.io/distroless/static-debian12:nonroot AS fusebox
COPY --from=build /out/extproc /extproc
USER nonroot:nonroot
EXPOSE 50051 8090
ENTRYPOINT ["/extproc"]
