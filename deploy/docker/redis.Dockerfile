# Redis for the compose stack where no image registry is reachable (deploy/local/images.sh): Debian's
# redis-server, 7.0 — the major the tests run and the compose file's default image (redis:7.0-alpine).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# Debian packages unpinned: bookworm's point and security releases replace versions, so a pin
# breaks the build; the base (a release, or a digest) fixes what they are.
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
# No config file: listen on every interface (the container's); the compose file passes the rest.
CMD ["redis-server", "--protected-mode", "no"]
