# SPDX-License-Identifier: Apache-2.0
# rdma-sidecar container image (Debian bookworm).
#   docker build -t rdma-sidecar:0.1.0 .
#   docker run --rm rdma-sidecar:0.1.0 --help
# Run it beside a worker that shares its /dev/shm and /run/rdma-sidecar (deploy/ has the
# Kubernetes pod); with plain Docker give the shared /dev/shm room (--shm-size, default 64 MiB).
# The ibverbs backend additionally needs the RDMA devices (--device /dev/infiniband/...) and
# memlock (--ulimit memlock=-1 or --cap-add IPC_LOCK); without them the sidecar uses TCP.

# ---- build ---------------------------------------------------------------------------------------
FROM debian:bookworm-slim AS build
WORKDIR /src
# The package list first, so the (slow) install is cached across source changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
 && cmake --build /build -j"$(nproc)" --target rdma-sidecar \
 && /build/rdma-sidecar --version

# ---- runtime -------------------------------------------------------------------------------------
FROM debian:bookworm-slim
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN bash /tmp/install-deps.sh --runtime \
 && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin nonroot \
 && install -d -o 65532 -g 65532 -m 0755 /run/rdma-sidecar
COPY --from=build /build/rdma-sidecar /usr/local/bin/rdma-sidecar

# Defaults as environment twins of the flags (rdma-sidecar --help); flags and -e override them.
# gRPC for workers on the unix socket in /run/rdma-sidecar (share that directory with the worker)
# and on :50051 for Kubernetes' gRPC probes; the peer data plane on a fixed port. Peers dial
# RDMA_SIDECAR_ADVERTISE (set it to the pod/host IP; the default, derived from 0.0.0.0, is
# 127.0.0.1). Key file (RDMA_SIDECAR_KEY_FILE) and NATS (RDMA_SIDECAR_NATS_URL) have no default.
ENV RDMA_SIDECAR_GRPC_LISTEN=unix:/run/rdma-sidecar/sidecar.sock,0.0.0.0:50051 \
    RDMA_SIDECAR_DATA_LISTEN=0.0.0.0:50052 \
    RDMA_SIDECAR_SHM_DIR=/dev/shm \
    RDMA_SIDECAR_LOG_LEVEL=info
EXPOSE 50051 50052
USER 65532:65532
# SIGTERM drains (health NOT_SERVING, live transfers finish within --grace-period) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/rdma-sidecar"]
