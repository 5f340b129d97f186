# syntax=docker/dockerfile:1
# idemgate's container image: built from the lock file in a Rust image, run from a
# distroless image (no shell, no package manager) as a non-root user.
#
#   docker build -t idemgate:dev .
#
# The final stage is distroless/cc (glibc + libgcc) rather than a static musl binary:
# the builder's Debian release matches the runtime's glibc, and glibc's allocator
# serves a proxy's many small allocations better than musl's.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches speed up rebuilds; the binary is copied out of the
# cache mount so that the next stage can take it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked --bin idemgate \
    && install -D -m 0755 target/dist/idemgate /out/idemgate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/idemgate /usr/local/bin/idemgate
# distroless's `nonroot` user; the Kubernetes manifests run as the same UID.
USER 65532:65532
# webhooks (listen) and admin (admin_listen: /metrics, /healthz, /readyz)
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/idemgate"]
CMD ["run"]
