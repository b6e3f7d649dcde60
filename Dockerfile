# syntax=docker/dockerfile:1
# SPDX-License-Identifier: Apache-2.0
# rdma-sidecar container image (Debian bookworm), with GPU memory support compiled in:
#   docker build --build-context cuda-include=/usr/local/cuda/include -t rdma-sidecar:0.1.0 .
#   docker run --rm rdma-sidecar:0.1.0 --help       # says "GPU memory: supported; ..."
# or scripts/build-image.sh (podman), which passes the CUDA headers the same way.
# Run it beside a worker that shares its /dev/shm and /run/rdma-sidecar (deploy/ has the
# Kubernetes pod); with plain Docker give the shared /dev/shm room (--shm-size, default 64 MiB).
# The ibverbs backend additionally needs the RDMA devices (--device /dev/infiniband/...) and
# memlock (--ulimit memlock=-1 or --cap-add IPC_LOCK); without them the sidecar uses TCP.

# scripts/build-image.sh builds it with podman where no registry is reachable (the base bootstrapped
# from Debian packages) and passes VERSION and COMMIT for the OCI labels.
ARG VERSION=0.1.0
ARG COMMIT=unknown

# ---- CUDA headers (build time only) --------------------------------------------------------------
# GPU memory support needs one header when compiling, the CUDA driver API's cuda.h (self-contained:
# it includes only stdlib.h and stdint.h); nothing links against CUDA: the sidecar dlopens the
# driver, libcuda.so.1, at run time, which the NVIDIA container runtime mounts from the node. So the
# image carries no CUDA file at all, and runs on nodes without GPUs too.
# Debian has no usable cuda.h: main none, non-free's nvidia-cuda-dev CUDA 11.8's (too old: the
# sidecar needs CUDA 12.0's cuGetProcAddress, and it is a 774 MB download for one header). So the
# build takes it from the build host, as a named build context (a directory, not the source tree):
#   --build-context cuda-include=DIR      DIR holds cuda.h of CUDA 12.0 or newer: a toolkit's
#                                         include directory (/usr/local/cuda/include), or that of
#                                         NVIDIA's small cuda-driver-dev-12-* package
# This empty stage stands in when no such context is given; the build then stops (GPU=required,
# the default: an image for the GPU overlays must not lack GPU support by accident), or, with
# --build-arg GPU=off, builds without GPU support (CUDA regions refused; GetInfo says so).
FROM scratch AS cuda-include

# ---- build ---------------------------------------------------------------------------------------
FROM debian:bookworm-slim AS build
WORKDIR /src
# The package list first, so the (slow) install is cached across source changes. Only what the
# daemon needs to build (--image-build), not the test, VM and benchmark tools.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --image-build && rm -rf /var/lib/apt/lists/*
ARG GPU=required
COPY --from=cuda-include / /opt/cuda/include/
COPY . .
RUN case "$GPU" in \
      required) test -f /opt/cuda/include/cuda.h || { \
        echo "no cuda.h: build with --build-context cuda-include=/usr/local/cuda/include (a directory" \
             "holding the CUDA toolkit's cuda.h; scripts/build-image.sh does this), or" \
             "--build-arg GPU=off for an image without GPU support" >&2; exit 1; } ;; \
      off) rm -rf /opt/cuda/include ;; \
      *) echo "GPU must be required or off, not '$GPU'" >&2; exit 1 ;; \
    esac \
 && cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release \
          $([ "$GPU" = required ] && echo -DCUDA_INCLUDE_DIR=/opt/cuda/include || echo -DSC_WITH_CUDA=OFF) \
 && cmake --build /build -j"$(nproc)" --target rdma-sidecar \
 && strip /build/rdma-sidecar \
 && /build/rdma-sidecar --version \
 && if [ "$GPU" = required ]; then /build/rdma-sidecar --help | grep -q '^GPU memory: supported'; fi \
 && cmake --build /build --target man_rdma_sidecar \
 && gzip -9n /build/man/rdma-sidecar.8

# ---- runtime -------------------------------------------------------------------------------------
FROM debian:bookworm-slim
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.title="rdma-sidecar" \
      org.opencontainers.image.description="Moves memory between ML pipeline workers over RDMA or TCP (gRPC API on a unix socket)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
COPY scripts/install-deps.sh /tmp/install-deps.sh
# The official slim base leaves /usr/share/groff out of every package (dpkg path-exclude in
# /etc/dpkg/dpkg.cfg.d/docker); man(1) needs groff's fonts and macros, so let those in again.
RUN echo 'path-include=/usr/share/groff/*' >/etc/dpkg/dpkg.cfg.d/zz-rdma-sidecar-man \
 && bash /tmp/install-deps.sh --runtime \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /tmp/install-deps.sh \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin nonroot \
 && install -d -o 65532 -g 65532 -m 0755 /run/rdma-sidecar
COPY --from=build /build/rdma-sidecar /usr/local/bin/rdma-sidecar
# `man rdma-sidecar` (man-db comes with install-deps.sh --runtime; the page is help2man's, from --help).
COPY --from=build /build/man/rdma-sidecar.8.gz /usr/local/share/man/man8/rdma-sidecar.8.gz

# Defaults as environment twins of the flags (rdma-sidecar --help); flags and -e override them.
# The full API only on the unix socket in /run/rdma-sidecar/sock (share /run/rdma-sidecar with the
# worker; the sidecar makes sock/ 0750 and the socket 0660, and refuses a directory others can
# write); Kubernetes' gRPC probes on the health-only port :50053 (grpc.health.v1 and nothing else);
# the peer data plane on a fixed port. A TCP API listener needs --grpc-tls-* or --grpc-token-file.
# Peers dial RDMA_SIDECAR_ADVERTISE (set it to the pod/host IP; the default, derived from 0.0.0.0,
# is 127.0.0.1). Key file (RDMA_SIDECAR_KEY_FILE) and NATS (RDMA_SIDECAR_NATS_URL) have no default.
ENV RDMA_SIDECAR_GRPC_LISTEN=unix:/run/rdma-sidecar/sock/sidecar.sock \
    RDMA_SIDECAR_HEALTH_LISTEN=0.0.0.0:50053 \
    RDMA_SIDECAR_DATA_LISTEN=0.0.0.0:50052 \
    RDMA_SIDECAR_SHM_DIR=/dev/shm \
    RDMA_SIDECAR_LOG_LEVEL=info
EXPOSE 50052 50053
USER 65532:65532
# SIGTERM drains (health NOT_SERVING, live transfers finish within --grace-period) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/rdma-sidecar"]
