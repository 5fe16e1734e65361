# A single-node Apache Kafka (KRaft) for the compose stack where no image registry is reachable
# (deploy/local/images.sh): Debian's Java 17 and the broker's jars that deploy/local/pom.xml resolves
# from Maven Central (the tests' broker), mounted at build time: `podman build -v <jars>:/jars:ro`.
# Configured as apache/kafka, the compose file's default image, is: KAFKA_FOO_BAR=x → foo.bar=x.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# Part of the layer's cache key: the jars' folder is named by the Kafka version and the pom's hash.
ARG KAFKA_JARS
# Debian packages unpinned: bookworm's point and security releases replace versions, so a pin
# breaks the build; the base (a release, or a digest) fixes what they are.
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && test -n "$KAFKA_JARS" && ls /jars/kafka-server-*.jar >/dev/null \
    && mkdir -p /opt/kafka/libs /opt/kafka/config /var/lib/kafka/data \
    && cp /jars/*.jar /opt/kafka/libs/ \
    && groupadd --system --gid 1000 kafka && useradd --system --uid 1000 --gid kafka kafka \
    && chown -R kafka:kafka /opt/kafka/config /var/lib/kafka
COPY kafka-entrypoint.sh /opt/kafka/bin/kafka-entrypoint.sh
COPY kafka-ready.sh /opt/kafka/bin/kafka-ready
COPY kafka-log4j2.properties /opt/kafka/config/log4j2.properties
USER kafka
EXPOSE 9092 9093
ENTRYPOINT ["/opt/kafka/bin/kafka-entrypoint.sh"]
