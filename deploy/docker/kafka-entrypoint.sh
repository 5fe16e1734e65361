#!/bin/bash
# The broker's configuration from the environment, as apache/kafka's image reads it: KAFKA_FOO_BAR=x
# becomes foo.bar=x (a double underscore a single one, a triple one a dash); CLUSTER_ID names the
# cluster when the data directory is formatted, on first start.
set -euo pipefail
conf=/opt/kafka/config/server.properties
: >"$conf"
while IFS='=' read -r key value; do
  case "$key" in
    KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS) continue ;;
  esac
  name="$(printf '%s' "${key#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/\x01/g' -e 's/_/./g' -e 's/\x01/_/g')"
  printf '%s=%s\n' "$name" "$value" >>"$conf"
done < <(env | grep '^KAFKA_' || true)
grep -q '^log.dirs=' "$conf" || echo "log.dirs=/var/lib/kafka/data" >>"$conf"
# shellcheck disable=SC2206 - the option variables are word lists
java=(java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} ${KAFKA_OPTS:-} -XX:+UseG1GC -Djava.awt.headless=true
      -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties -cp '/opt/kafka/libs/*')
data="$(sed -n 's/^log.dirs=//p' "$conf" | cut -d, -f1)"
if [[ ! -f "$data/meta.properties" ]]; then
  cluster_id="${CLUSTER_ID:-$("${java[@]}" kafka.tools.StorageTool random-uuid)}"
  "${java[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$conf"
fi
exec "${java[@]}" kafka.Kafka "$conf"
