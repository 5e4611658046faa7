# syntax=docker/dockerfile:1
# The gpu-tenancy image: one binary for the controller (`gpu-tenancy controller`) and the node
# agent (`gpu-tenancy agent run`), see deploy/.
#
#   docker build -t gpu-tenancy:0.1.0 .
#
# Needs BuildKit (the default builder of current Docker) for the cache mounts.

# The toolchain the project is developed and tested with (its gcc and make build jemalloc, the
# binary's allocator).
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The whole workspace: Cargo reads every member's manifest (and their declared targets) even
# when it builds only gpu-tenancy. .dockerignore keeps out target/, e2e/bin/ and the Go code.
COPY Cargo.toml Cargo.lock ./
COPY core core
COPY operator operator
COPY e2e/suite e2e/suite
COPY e2e/nvml-sim e2e/nvml-sim
COPY e2e/fleet e2e/fleet
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p gpu-tenancy --locked \
    && install -D -m 0755 target/release/gpu-tenancy /out/gpu-tenancy

# glibc of the same Debian release as the builder. NVML and the CUDA driver are not in the
# image: the agent loads libnvidia-ml.so.1 and libcuda.so.1 at run time, from the driver the
# NVIDIA container runtime mounts in.
FROM debian:bookworm-slim
COPY --from=build /out/gpu-tenancy /usr/local/bin/gpu-tenancy
# Non-root by default (the controller); the agent's DaemonSet runs it as root, privileged.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-tenancy"]
