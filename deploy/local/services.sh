#!/usr/bin/env bash
# Local Redis (a single node, and a Redis Cluster of 3 primaries + 3 replicas) + single-node Apache
# Kafka (KRaft) on loopback, for tests and demos, AWS's amazon-ec2-metadata-mock (built once with
# `go install`; tests start it per case), promtool (unpacked once from Debian's package), and for the Helm
# chart's tests helm (built once with `go install`) and prometheus-operator's CRDs (its Go module, once).
#
#   deploy/local/services.sh start|stop|status|env
#   deploy/local/services.sh kafka-start|kafka-stop   (just the broker; tests run a second one with
#       DINREC_SERVICES_RUN, DINREC_LOCAL_KAFKA_PORT and DINREC_LOCAL_KAFKA_CONTROLLER_PORT set)
#
# Idempotent: `start` on running services only checks them; it returns once each answers.
# If DINREC_REDIS_URL / DINREC_REDIS_CLUSTER_URL / DINREC_KAFKA_BOOTSTRAP are already set, those
# servers are used and nothing is started for them. `env` prints the export lines the tests read.
#
# Kafka is not downloaded as a tarball (no such host is reachable here): the broker's jars come
# from Maven Central through pom.xml beside this file, and are cached outside the clone.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${DINREC_SERVICES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dinrec/services}"
REDIS_PORT="${DINREC_LOCAL_REDIS_PORT:-16379}"
CLUSTER_BASE_PORT="${DINREC_LOCAL_REDIS_CLUSTER_PORT:-17000}"  # six nodes: this port and the five after it
KAFKA_PORT="${DINREC_LOCAL_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${DINREC_LOCAL_KAFKA_CONTROLLER_PORT:-19093}"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml")"
JARS="$STATE/kafka-jars-$KAFKA_VERSION-$(sha1sum "$HERE/pom.xml" | cut -c1-10)"
RUN="${DINREC_SERVICES_RUN:-$STATE/run}"
mkdir -p "$RUN"

log() { printf '[services] %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # wait_for NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 5))); do
    if "$@"; then log "$name ready"; return 0; fi
    sleep 0.2
  done
  log "$name not ready after ${secs}s"; return 1
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---------------------------------------------------------------- browser (the dashboard's test)
browser_install() {
  if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then return; fi
  log "installing chromium + chromium-driver (Debian packages) for the dashboard test"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null
}

# ---------------------------------------------------------------- redis
redis_ping() { redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

redis_start() {
  if [[ -n "${DINREC_REDIS_URL:-}" ]]; then log "redis: using DINREC_REDIS_URL=$DINREC_REDIS_URL"; return; fi
  if ! command -v redis-server >/dev/null; then
    log "installing redis-server (Debian package)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
  fi
  if redis_ping; then log "redis already running on $REDIS_PORT"; return; fi
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$RUN/redis.pid" --logfile "$RUN/redis.log" --dir "$RUN"
  wait_for redis 20 redis_ping
}

redis_stop() {
  if pid_alive "$RUN/redis.pid"; then kill "$(cat "$RUN/redis.pid")"; log "redis stopped"; fi
  rm -f "$RUN/redis.pid"
}

# ---------------------------------------------------------------- redis cluster
# Six redis-server processes with cluster-enabled on loopback, joined by `redis-cli --cluster create`
# (three primaries, one replica each): the real cluster protocol (MOVED/ASK, slots, failover), not a proxy.
cluster_ports() { seq "$CLUSTER_BASE_PORT" $((CLUSTER_BASE_PORT + 5)); }

cluster_ok() { redis-cli -p "$CLUSTER_BASE_PORT" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }

redis_cluster_start() {
  if [[ -n "${DINREC_REDIS_CLUSTER_URL:-}" ]]; then
    log "redis cluster: using DINREC_REDIS_CLUSTER_URL=$DINREC_REDIS_CLUSTER_URL"; return
  fi
  if cluster_ok; then log "redis cluster already running on $CLUSTER_BASE_PORT-$((CLUSTER_BASE_PORT + 5))"; return; fi
  local port nodes=()
  for port in $(cluster_ports); do
    mkdir -p "$RUN/cluster-$port"
    rm -f "$RUN/cluster-$port/nodes.conf"  # a fresh cluster each start: nothing to keep between runs
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000 --save '' --appendonly no --daemonize yes \
      --pidfile "$RUN/cluster-$port.pid" --logfile "$RUN/cluster-$port/redis.log" --dir "$RUN/cluster-$port"
    nodes+=("127.0.0.1:$port")
  done
  for port in $(cluster_ports); do wait_for "redis cluster node $port" 20 redis-cli -p "$port" ping >/dev/null; done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$RUN/cluster-create.log" 2>&1 \
    || { tail -20 "$RUN/cluster-create.log" >&2; return 1; }
  wait_for "redis cluster" 30 cluster_ok
}

redis_cluster_stop() {
  local port
  for port in $(cluster_ports); do
    if pid_alive "$RUN/cluster-$port.pid"; then kill "$(cat "$RUN/cluster-$port.pid")"; fi
    rm -f "$RUN/cluster-$port.pid"
  done
  log "redis cluster stopped"
}

# ---------------------------------------------------------------- kafka
kafka_jars() {
  if [[ -f "$JARS/.complete" ]]; then return; fi
  log "resolving Apache Kafka $KAFKA_VERSION jars from Maven Central (once)"
  rm -rf "$JARS"
  mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies \
    -DoutputDirectory="$JARS" -DincludeScope=runtime >&2
  touch "$JARS/.complete"
}

kafka_config() {
  local data="$RUN/kafka-data"
  cat >"$RUN/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
  cp "$HERE/../docker/kafka-log4j2.properties" "$RUN/log4j2.properties"
}

kafka_java() {
  java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$RUN/log4j2.properties" -cp "$JARS/*" "$@"
}

kafka_start() {
  if [[ -n "${DINREC_KAFKA_BOOTSTRAP:-}" ]]; then log "kafka: using DINREC_KAFKA_BOOTSTRAP=$DINREC_KAFKA_BOOTSTRAP"; return; fi
  if pid_alive "$RUN/kafka.pid" && port_open "$KAFKA_PORT"; then log "kafka already running on $KAFKA_PORT"; return; fi
  if port_open "$KAFKA_PORT"; then log "port $KAFKA_PORT is taken by something else"; return 1; fi
  kafka_jars
  kafka_config
  if [[ ! -f "$RUN/kafka-data/meta.properties" ]]; then
    rm -rf "$RUN/kafka-data"
    local cluster_id
    cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid)"
    kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN/server.properties" >&2
  fi
  nohup bash -c "$(declare -f kafka_java); JARS='$JARS' RUN='$RUN' kafka_java kafka.Kafka '$RUN/server.properties'" \
    >"$RUN/kafka.log" 2>&1 &
  echo $! >"$RUN/kafka.pid"
  if ! wait_for kafka 90 port_open "$KAFKA_PORT"; then tail -40 "$RUN/kafka.log" >&2; return 1; fi
}

kafka_stop() {
  if pid_alive "$RUN/kafka.pid"; then
    local pid; pid="$(cat "$RUN/kafka.pid")"
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    log "kafka stopped"
  fi
  rm -f "$RUN/kafka.pid"
}

# ---------------------------------------------------------------- ec2 metadata mock
AEMM_VERSION=v1.13.0
AEMM="$STATE/bin-aemm-$AEMM_VERSION/ec2-metadata-mock"

aemm_install() {
  if [[ -n "${DINREC_AEMM:-}" ]]; then log "metadata mock: using DINREC_AEMM=$DINREC_AEMM"; return; fi
  if [[ -x "$AEMM" ]]; then return; fi
  log "building amazon-ec2-metadata-mock $AEMM_VERSION with go install (once)"
  GOBIN="$(dirname "$AEMM")" GOFLAGS=-modcacherw GOMODCACHE="$STATE/go-mod" \
    go install "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock@$AEMM_VERSION" >&2
}

# ---------------------------------------------------------------- promtool (the alert rules' tests)
# Debian's prometheus package, unpacked for its promtool alone (nothing installed, no daemon started).
PROMTOOL_DEB_VERSION=2.42.0+ds-5+deb12u1
PROMTOOL="$STATE/bin-promtool-$PROMTOOL_DEB_VERSION/promtool"

promtool_install() {
  if [[ -n "${DINREC_PROMTOOL:-}" ]]; then log "promtool: using DINREC_PROMTOOL=$DINREC_PROMTOOL"; return; fi
  if [[ -x "$PROMTOOL" ]]; then return; fi
  log "unpacking promtool from Debian's prometheus $PROMTOOL_DEB_VERSION (once)"
  local tmp
  tmp="$(mktemp -d)"
  # The pinned version, else (once Debian has replaced it with a point release) the one it has now.
  (cd "$tmp" && { apt-get download -qq "prometheus=$PROMTOOL_DEB_VERSION" 2>/dev/null \
                  || { apt-get update -qq && { apt-get download -qq "prometheus=$PROMTOOL_DEB_VERSION" \
                                               || apt-get download -qq prometheus; }; }; } \
              && dpkg-deb -x prometheus_*.deb x) >/dev/null 2>&1
  mkdir -p "$(dirname "$PROMTOOL")"
  mv "$tmp/x/usr/bin/promtool" "$PROMTOOL"
  rm -rf "$tmp"
}

# ---------------------------------------------------------------- helm + CRDs (the chart's tests)
# Helm from the Go module proxy (no other host serves it here); the ServiceMonitor/PrometheusRule CRDs, whose
# schemas the rendered objects are checked against, from prometheus-operator's module (example/…-crd).
HELM_VERSION=v4.3.2
HELM="$STATE/bin-helm-$HELM_VERSION/helm"
PROM_OPERATOR_VERSION=v0.85.0
PROM_CRDS="$STATE/go-mod/github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION/example/prometheus-operator-crd"

helm_install() {
  if [[ -z "${DINREC_HELM:-}" && ! -x "$HELM" ]]; then
    log "building helm $HELM_VERSION with go install (once, a few minutes)"
    GOBIN="$(dirname "$HELM")" GOFLAGS=-modcacherw GOMODCACHE="$STATE/go-mod" \
      go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
  fi
  if [[ -z "${DINREC_PROMETHEUS_CRDS:-}" && ! -d "$PROM_CRDS" ]]; then
    log "downloading prometheus-operator $PROM_OPERATOR_VERSION's module for its CRDs (once)"
    GOFLAGS=-modcacherw GOMODCACHE="$STATE/go-mod" \
      go mod download "github.com/prometheus-operator/prometheus-operator@$PROM_OPERATOR_VERSION" >&2
  fi
}

# ---------------------------------------------------------------- commands
print_env() {
  echo "export DINREC_REDIS_URL=${DINREC_REDIS_URL:-redis://127.0.0.1:$REDIS_PORT/0}"
  echo "export DINREC_REDIS_CLUSTER_URL=${DINREC_REDIS_CLUSTER_URL:-redis://127.0.0.1:$CLUSTER_BASE_PORT}"
  echo "export DINREC_KAFKA_BOOTSTRAP=${DINREC_KAFKA_BOOTSTRAP:-127.0.0.1:$KAFKA_PORT}"
  echo "export DINREC_AEMM=${DINREC_AEMM:-$AEMM}"
  echo "export DINREC_PROMTOOL=${DINREC_PROMTOOL:-$PROMTOOL}"
  echo "export DINREC_HELM=${DINREC_HELM:-$HELM}"
  echo "export DINREC_PROMETHEUS_CRDS=${DINREC_PROMETHEUS_CRDS:-$PROM_CRDS}"
}

case "${1:-}" in
  start) redis_start; redis_cluster_start; kafka_start; aemm_install; promtool_install; helm_install; browser_install; print_env ;;
  stop) kafka_stop; redis_cluster_stop; redis_stop ;;
  kafka-start) kafka_start ;;
  kafka-jars) kafka_jars; echo "$JARS" ;;
  kafka-stop) kafka_stop ;;
  status)
    if redis_ping; then echo "redis: up (127.0.0.1:$REDIS_PORT)"; else echo "redis: down"; fi
    if cluster_ok; then echo "redis cluster: up (127.0.0.1:$CLUSTER_BASE_PORT-$((CLUSTER_BASE_PORT + 5)))"; else echo "redis cluster: down"; fi
    if port_open "$KAFKA_PORT"; then echo "kafka: up (127.0.0.1:$KAFKA_PORT)"; else echo "kafka: down"; fi ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env|kafka-start|kafka-stop|kafka-jars" >&2; exit 2 ;;
esac
