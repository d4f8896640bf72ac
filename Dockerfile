# Laconic as a sidecar image: built in one stage, run unprivileged in another.
# Build: docker build -t laconic .
#        docker build --build-arg PGO=0 -t laconic .   # a plain release build, in half the time
# Run:   docker run -p 27018:27018 -e LACONIC_UPSTREAM=mongodb://db:27017/ laconic

FROM rust:1-bookworm AS build
# PGO=1: a profile-guided build (scripts/build-pgo.sh). An instrumented
# proxy serves the benchmark's operations in front of the tests' SecantusDB,
# installed from PyPI into a venv (so python3-venv), and the release build
# is optimized by what it ran: 0.82-0.96 of the plain build's CPU per
# operation (README, "Where the proxy's time goes").
ARG PGO=1
RUN if [ "$PGO" = 1 ]; then \
      apt-get update && apt-get install -y --no-install-recommends python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY scripts ./scripts
RUN if [ "$PGO" = 1 ]; then \
      scripts/build-pgo.sh && cp target/pgo/release/laconic /laconic; \
    else \
      cargo build --release --locked --bin laconic && cp target/release/laconic /laconic; \
    fi

FROM debian:bookworm-slim
RUN useradd --system --no-create-home --uid 10001 laconic
COPY --from=build /laconic /usr/local/bin/laconic
COPY config/laconic.toml /etc/laconic/laconic.toml
USER 10001
# 27018: drivers; 9216: /metrics, /healthz, /readyz (probes).
EXPOSE 27018 9216
ENV LACONIC_LISTEN=0.0.0.0:27018 \
    LACONIC_METRICS_LISTEN=0.0.0.0:9216 \
    LACONIC_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/laconic", "serve", "--config", "/etc/laconic/laconic.toml"]
