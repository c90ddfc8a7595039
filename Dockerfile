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
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/fusebox-llm/fusebox/cmd/extproc/mainlib.Version=${VERSION}" -o /out/extproc ./cmd/extproc \
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
