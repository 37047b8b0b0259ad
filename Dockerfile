# The Flotilla image: `flotilla` (aggregator, control, scheduler, route, up, the CLI) and
# `flotilla-agent`, the image deploy/kubernetes names (ghcr.io/flotilla/flotilla:VERSION).
#   docker build -t ghcr.io/flotilla/flotilla:0.1.0 .

FROM rust:1-slim-bookworm AS build
# No OpenSSL (TLS is rustls); protoc for etcd-client's protos, make for jemalloc.
RUN apt-get update \
    && apt-get install -y --no-install-recommends make=4.3-4.1 protobuf-compiler=3.21.12-3+deb12u1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p flotilla -p flotilla-agent-bin \
    && install -D -m 0755 target/release/flotilla /out/flotilla \
    && install -D -m 0755 target/release/flotilla-agent /out/flotilla-agent

FROM debian:bookworm-slim
# No CA bundle: every TLS peer is trusted through a CA file given by flag (--ca,
# --grpc-ca), never through the system's roots.
COPY --from=build /out/ /usr/local/bin/
# Servers run as this unprivileged user. The agent is the exception: it creates cgroups
# for its workloads in the host's hierarchy, so its DaemonSet runs it as root and
# privileged (runAsUser: 0 in deploy/kubernetes/agent.yaml overrides this USER).
RUN groupadd --system --gid 10001 flotilla \
    && useradd --system --uid 10001 --gid flotilla --home-dir /var/lib/flotilla --create-home flotilla
USER 10001:10001
WORKDIR /var/lib/flotilla
# 7000 QUIC/gRPC (UDP+TCP) and 7001 heartbeats (UDP) for a shard, 7700 the control
# plane's API, 9100/9101 /metrics, /healthz and /readyz of shards and agents.
EXPOSE 7000/udp 7000/tcp 7001/udp 7700/tcp 9100/tcp 9101/tcp
ENTRYPOINT ["flotilla"]
CMD ["--help"]
