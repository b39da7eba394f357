# The estafeta server as a container image.
#
#   docker build -t estafeta .
#   docker run -d --name estafeta -p 8080:8080 -v estafeta-data:/data estafeta
#   docker logs estafeta        # the admin token, printed once at first start
#
# Build stage: the release binary, with the lock file's exact dependencies.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin estafeta \
 && cp target/release/estafeta /usr/local/bin/estafeta

# Runtime stage: Debian slim with the binary and a user of its own.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /data --shell /usr/sbin/nologin estafeta \
 && mkdir /data && chown estafeta:estafeta /data && chmod 0700 /data
COPY --from=build /usr/local/bin/estafeta /usr/local/bin/estafeta
USER estafeta
VOLUME /data
ENV ESTAFETA_DATA_DIR=/data \
    ESTAFETA_LISTEN=0.0.0.0:8080
EXPOSE 8080
# Healthy once start-up recovery is done and storage is writable; bash's
# /dev/tcp keeps curl out of the image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /readyz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["estafeta"]
CMD ["serve"]
