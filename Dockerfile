# Laconic as a sidecar image: built in one stage, run unprivileged in another.
# Build: docker build -t laconic .
# Run:   docker run -p 27018:27018 -e LACONIC_UPSTREAM=mongodb://db:27017/ laconic

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin laconic

FROM debian:bookworm-slim
RUN useradd --system --no-create-home --uid 10001 laconic
COPY --from=build /src/target/release/laconic /usr/local/bin/laconic
COPY config/laconic.toml /etc/laconic/laconic.toml
USER 10001
# 27018: drivers; 9216: /metrics, /healthz, /readyz (probes).
EXPOSE 27018 9216
ENV LACONIC_LISTEN=0.0.0.0:27018 \
    LACONIC_METRICS_LISTEN=0.0.0.0:9216 \
    LACONIC_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/laconic", "serve", "--config", "/etc/laconic/laconic.toml"]
