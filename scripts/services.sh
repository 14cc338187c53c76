#!/usr/bin/env bash
# Fetch, start, health-check and stop causeway's local services without Docker:
# Kafka (single-node KRaft), Project Nessie, Redis, Prometheus and causeway's lag exporter.
#
#   scripts/services.sh fetch            download jars / install packages (cached, idempotent)
#   scripts/services.sh start [NAME...]  start what is not already running and healthy
#   scripts/services.sh status           one line per service
#   scripts/services.sh stop [NAME...]   stop only the processes this script started
#   scripts/services.sh env              print the connection settings as CAUSEWAY_* exports
#   scripts/services.sh prometheus-config  print the Prometheus config that start writes
#   scripts/services.sh --secure start|stop|status|env   the secured stack (or CAUSEWAY_SECURE=1), beside
#                                        the plain one: Kafka SASL_SSL (SCRAM, PLAIN, OAUTHBEARER) and
#                                        mutual TLS, Redis TLS + password,
#                                        a bearer-token proxy in front of Nessie (docs/security.md)
#
# Every log, pid file and data folder lives under $CAUSEWAY_RUN_DIR (default: <repo>/.causeway/run).
# Downloads are cached under $CAUSEWAY_CACHE_DIR (default: ~/.cache/causeway) and ~/.m2, so a fresh
# clone on a machine that has run this before starts in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECURE="${CAUSEWAY_SECURE:-0}"
if [[ "${1:-}" == "--secure" ]]; then SECURE=1; shift; fi
RUN_DIR="${CAUSEWAY_RUN_DIR:-$ROOT/.causeway/run}"
CACHE_DIR="${CAUSEWAY_CACHE_DIR:-$HOME/.cache/causeway}"

KAFKA_VERSION="${CAUSEWAY_KAFKA_VERSION:-3.9.2}"
NESSIE_VERSION="${CAUSEWAY_NESSIE_VERSION:-0.99.0}"
KAFKA_PORT="${CAUSEWAY_KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${CAUSEWAY_KAFKA_CONTROLLER_PORT:-9093}"
REDIS_PORT="${CAUSEWAY_REDIS_PORT:-6379}"
NESSIE_PORT="${CAUSEWAY_NESSIE_PORT:-19120}"
NESSIE_MGMT_PORT="${CAUSEWAY_NESSIE_MANAGEMENT_PORT:-19121}"
PROMETHEUS_PORT="${CAUSEWAY_PROMETHEUS_PORT:-9090}"
LAG_EXPORTER_PORT="${CAUSEWAY_LAG_EXPORTER_PORT:-6065}"
# Prometheus file-based service discovery: each running worker and lag exporter writes its target
# here (monitoring/discovery.py) and removes it when it stops, so Prometheus scrapes what runs.
SD_DIR="${CAUSEWAY_PROMETHEUS_SD_DIR:-$RUN_DIR/prometheus-sd}"
PYTHON="${CAUSEWAY_PYTHON:-$ROOT/.venv/bin/python}"
KAFKA_HEAP="${CAUSEWAY_KAFKA_HEAP:--Xms256m -Xmx768m}"
NESSIE_HEAP="${CAUSEWAY_NESSIE_HEAP:--Xms128m -Xmx768m}"

ALL_SERVICES=(redis kafka nessie prometheus lag-exporter)

# Secured mode: its own run dir and ports, so it runs beside the plain stack and never touches it.
if [[ "$SECURE" == 1 ]]; then
  RUN_DIR="${CAUSEWAY_SECURE_RUN_DIR:-$ROOT/.causeway/run-secure}"
  KAFKA_PORT="${CAUSEWAY_SECURE_KAFKA_PORT:-19192}"
  KAFKA_CONTROLLER_PORT="${CAUSEWAY_SECURE_KAFKA_CONTROLLER_PORT:-19193}"
  KAFKA_MTLS_PORT="${CAUSEWAY_SECURE_KAFKA_MTLS_PORT:-19194}"  # SSL listener that requires a client certificate
  REDIS_PORT="${CAUSEWAY_SECURE_REDIS_PORT:-16380}"
  NESSIE_PROXY_PORT="${CAUSEWAY_SECURE_NESSIE_PORT:-19443}"
  # The proxy checks tokens and forwards to this (plain) Nessie.
  NESSIE_UPSTREAM="${CAUSEWAY_SECURE_NESSIE_UPSTREAM:-http://127.0.0.1:$NESSIE_PORT}"
  KAFKA_HEAP="${CAUSEWAY_SECURE_KAFKA_HEAP:--Xms128m -Xmx512m}"
  TLS_DIR="$RUN_DIR/tls"
  SECRETS_FILE="$RUN_DIR/secrets.env"
  ALL_SERVICES=(redis kafka nessie-proxy)
fi

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

pidfile() { echo "$RUN_DIR/$1.pid"; }
logfile() { echo "$RUN_DIR/$1.log"; }

# A pid counts as ours only if it is alive and its environment carries our run-dir marker, so a
# recycled pid or somebody else's server is never killed (redis rewrites its command line, so the
# environment is the reliable place).
our_pid() {
  local f; f="$(pidfile "$1")"
  [[ -f "$f" ]] || return 1
  local pid; pid="$(cat "$f")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  if ! tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "CAUSEWAY_SERVICE_MARK=$RUN_DIR"; then
    # redis's setproctitle overwrites its environment; it runs with its cwd inside the run dir.
    local cwd; cwd="$(readlink "/proc/$pid/cwd" 2>/dev/null)" || return 1
    [[ "$cwd" == "$RUN_DIR" || "$cwd" == "$RUN_DIR"/* ]] || return 1
  fi
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

http_ok() { curl -fsS -m 3 -o /dev/null "$1" 2>/dev/null; }

# A broker this script did not start: ask it for its API versions (a JVM start, ~2 s, so only then).
kafka_answers() {
  local libs="$CACHE_DIR/kafka-$KAFKA_VERSION/libs"
  [[ -d "$libs" ]] || return 1
  timeout 20 java -cp "$libs/*" -Dlog4j.configuration=file:/dev/null kafka.admin.BrokerApiVersionsCommand \
    --bootstrap-server "127.0.0.1:$KAFKA_PORT" 2>/dev/null | grep -q "id: "
}

healthy() {
  if [[ "$SECURE" == 1 ]]; then secure_healthy "$1"; return; fi
  case "$1" in
    redis) redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG ;;
    kafka) port_open "$KAFKA_PORT" && { grep -q "Kafka Server started" "$(logfile kafka)" 2>/dev/null \
             || kafka_answers; } ;;
    nessie) http_ok "http://127.0.0.1:$NESSIE_MGMT_PORT/q/health/ready" \
              && http_ok "http://127.0.0.1:$NESSIE_PORT/api/v2/config" ;;
    prometheus) http_ok "http://127.0.0.1:$PROMETHEUS_PORT/-/ready" ;;
    lag-exporter) http_ok "http://127.0.0.1:$LAG_EXPORTER_PORT/metrics" ;;
    *) die "unknown service '$1' (known: ${ALL_SERVICES[*]})" ;;
  esac
}

service_port() {
  case "$1" in
    redis) echo "$REDIS_PORT" ;; kafka) echo "$KAFKA_PORT" ;;
    nessie) echo "$NESSIE_PORT" ;; prometheus) echo "$PROMETHEUS_PORT" ;;
    lag-exporter) echo "$LAG_EXPORTER_PORT" ;; nessie-proxy) echo "$NESSIE_PROXY_PORT" ;;
  esac
}

# ---------------------------------------------------------------------------------------------- fetch
java21() {
  # Nessie's Quarkus build needs Java 21+; the machine default may be 17.
  if [[ -n "${CAUSEWAY_NESSIE_JAVA_HOME:-}" ]]; then echo "$CAUSEWAY_NESSIE_JAVA_HOME/bin/java"; return; fi
  local d v
  for d in /usr/lib/jvm/*; do
    [[ -x "$d/bin/java" ]] || continue
    v="$("$d/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
    if [[ -n "$v" && "$v" -ge 21 ]]; then echo "$d/bin/java"; return; fi
  done
  return 1
}

fetch_debs() {
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
  command -v curl >/dev/null || missing+=(curl)
  command -v mvn >/dev/null || missing+=(maven)
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

fetch_kafka() {
  local dir="$CACHE_DIR/kafka-$KAFKA_VERSION"
  if [[ -f "$dir/.complete" ]]; then return; fi
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central (cached in $dir)"
  mkdir -p "$dir"
  sed "s/@KAFKA_VERSION@/$KAFKA_VERSION/g" "$ROOT/scripts/kafka-pom.xml" >"$dir/pom.xml"
  (cd "$dir" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$dir/libs") \
    >"$dir/fetch.log" 2>&1 || die "Kafka jar download failed; see $dir/fetch.log"
  touch "$dir/.complete"
}

fetch_nessie() {
  local jar="$CACHE_DIR/nessie-quarkus-$NESSIE_VERSION-runner.jar"
  [[ -f "$jar" ]] && return
  log "fetching Nessie $NESSIE_VERSION runner jar from Maven Central"
  mkdir -p "$CACHE_DIR"
  mvn -q -B dependency:copy \
    -Dartifact="org.projectnessie.nessie:nessie-quarkus:$NESSIE_VERSION:jar:runner" \
    -DoutputDirectory="$CACHE_DIR" >"$CACHE_DIR/nessie-fetch.log" 2>&1 \
    || die "Nessie jar download failed; see $CACHE_DIR/nessie-fetch.log"
}

cmd_fetch() {
  fetch_debs
  fetch_kafka
  fetch_nessie
  java21 >/dev/null || die "Nessie needs Java 21+; none found under /usr/lib/jvm (set CAUSEWAY_NESSIE_JAVA_HOME)"
}

# ---------------------------------------------------------------------------------------------- start
launch() {
  # launch NAME CMD...: start detached, record the pid.
  local name="$1"; shift
  : >"$(logfile "$name")"
  (cd "$RUN_DIR" && CAUSEWAY_SERVICE_MARK="$RUN_DIR" exec setsid nohup "$@" >>"$(logfile "$name")" 2>&1 </dev/null) &
  echo $! >"$(pidfile "$name")"
}

start_redis() {
  mkdir -p "$RUN_DIR/redis-data"
  # appendonly everysec: a Redis restart keeps dedupe marks; Nessie's commit offsets stay the truth.
  launch redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$RUN_DIR/redis-data" \
    --appendonly yes --appendfsync everysec --save "" --daemonize no \
    --pidfile "$RUN_DIR/redis.server.pid" --logfile ""
}

start_kafka() {
  local dir="$CACHE_DIR/kafka-$KAFKA_VERSION" data="$RUN_DIR/kafka-data" conf="$RUN_DIR/kafka.properties"
  mkdir -p "$data"
  cat >"$conf" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=168
log.segment.bytes=134217728
EOF
  local cp="$dir/libs/*"
  local log4j="$RUN_DIR/kafka-log4j.properties"
  cat >"$log4j" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
EOF
  if [[ ! -f "$data/meta.properties" ]]; then
    local cluster_id
    cluster_id="$(java -cp "$cp" -Dlog4j.configuration="file:$log4j" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
    java -cp "$cp" -Dlog4j.configuration="file:$log4j" kafka.tools.StorageTool format \
      -t "$cluster_id" -c "$conf" >"$RUN_DIR/kafka-format.log" 2>&1 \
      || die "kafka: storage format failed; see $RUN_DIR/kafka-format.log"
  fi
  # shellcheck disable=SC2086
  launch kafka java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$log4j" -Dcauseway.run.dir="$RUN_DIR" -cp "$cp" kafka.Kafka "$conf"
}

start_nessie() {
  local java; java="$(java21)" || die "nessie: needs Java 21+ (set CAUSEWAY_NESSIE_JAVA_HOME)"
  mkdir -p "$RUN_DIR/nessie-data"
  # Nessie's Iceberg REST catalog (/iceberg) for other engines: a default warehouse on an object store
  # (it refuses file://); S3 keys reach it as env vars (Quarkus maps CAUSEWAY_S3_NAME to causeway.s3.name).
  local catalog=(-Dnessie.catalog.default-warehouse=causeway
    -Dnessie.catalog.warehouses.causeway.location="${CAUSEWAY_NESSIE_WAREHOUSE:-s3://causeway/warehouse}"
    -Dnessie.catalog.object-stores.health-check.enabled=false
    -Dnessie.catalog.service.s3.default-options.region="${CAUSEWAY_S3_REGION:-us-east-1}"
    -Dnessie.catalog.service.s3.default-options.path-style-access=true)
  if [[ -n "${CAUSEWAY_S3_ENDPOINT:-}" ]]; then
    catalog+=(-Dnessie.catalog.service.s3.default-options.endpoint="$CAUSEWAY_S3_ENDPOINT"
      -Dnessie.catalog.service.s3.default-options.access-key=urn:nessie-secret:quarkus:causeway.s3)
    export CAUSEWAY_S3_NAME="${CAUSEWAY_S3_ACCESS_KEY:-}" CAUSEWAY_S3_SECRET="${CAUSEWAY_S3_SECRET_KEY:-}"
  fi
  # shellcheck disable=SC2086
  launch nessie "$java" $NESSIE_HEAP -Dcauseway.run.dir="$RUN_DIR" "${catalog[@]}" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$NESSIE_PORT" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$NESSIE_MGMT_PORT" \
    -Dnessie.version.store.type=ROCKSDB \
    -Dnessie.version.store.persist.rocks.database-path="$RUN_DIR/nessie-data" \
    -Dquarkus.otel.sdk.disabled=true -Dquarkus.log.console.json=false \
    -jar "$CACHE_DIR/nessie-quarkus-$NESSIE_VERSION-runner.jar"
}

prometheus_config() {
  cat <<EOF
# Generated by scripts/services.sh: the jobs of monitoring/prometheus/prometheus.yml (docker-compose),
# with file-based discovery instead of DNS: workers and the lag exporter register in $SD_DIR.
global:
  scrape_interval: ${CAUSEWAY_SCRAPE_INTERVAL:-2s}
  evaluation_interval: ${CAUSEWAY_SCRAPE_INTERVAL:-2s}
rule_files:
  - $ROOT/monitoring/prometheus/rules/*.yml
scrape_configs:
  - job_name: causeway
    file_sd_configs:
      - files: ['$SD_DIR/worker-*.json']
  - job_name: causeway-lag
    file_sd_configs:
      - files: ['$SD_DIR/lag-exporter-*.json']
  - job_name: prometheus
    static_configs:
      - targets: ['127.0.0.1:$PROMETHEUS_PORT']
EOF
}

start_prometheus() {
  mkdir -p "$RUN_DIR/prometheus-data" "$SD_DIR"
  local conf="$RUN_DIR/prometheus.yml"
  prometheus_config >"$conf"
  launch prometheus prometheus --config.file="$conf" --storage.tsdb.path="$RUN_DIR/prometheus-data" \
    --web.listen-address="127.0.0.1:$PROMETHEUS_PORT" --web.enable-lifecycle \
    --storage.tsdb.retention.time=2d
}

start_lag_exporter() {
  [[ -x "$PYTHON" ]] || die "lag-exporter: no Python at $PYTHON (run scripts/setup.sh, or set CAUSEWAY_PYTHON)"
  mkdir -p "$SD_DIR"
  (
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" CAUSEWAY_KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
    export CAUSEWAY_LAG_EXPORTER_PORT="$LAG_EXPORTER_PORT" CAUSEWAY_PROMETHEUS_SD_DIR="$SD_DIR"
    launch lag-exporter "$PYTHON" -m monitoring.lag_exporter
  )
}

wait_healthy() {
  local name="$1" timeout="${2:-90}" start=$SECONDS pid
  until healthy "$name"; do
    pid="$(our_pid "$name")" || {
      tail -n 20 "$(logfile "$name")" >&2 || true
      die "$name exited during start-up; see $(logfile "$name")"
    }
    if ((SECONDS - start > timeout)); then
      tail -n 20 "$(logfile "$name")" >&2 || true
      die "$name not healthy after ${timeout}s (pid $pid); see $(logfile "$name")"
    fi
    sleep 0.5
  done
}

start_one() {
  local name="$1" pid
  if pid="$(our_pid "$name")"; then
    if healthy "$name"; then log "$name already running (pid $pid)"; return; fi
    log "$name (pid $pid) is starting; waiting"
    wait_healthy "$name"; return
  fi
  if port_open "$(service_port "$name")"; then
    if healthy "$name"; then
      log "$name: a healthy server we did not start answers on port $(service_port "$name"); using it"
      return
    fi
    die "$name: port $(service_port "$name") is taken by another process; set CAUSEWAY_${name^^}_PORT"
  fi
  if [[ "$SECURE" == 1 ]]; then secure_setup; fi
  case "$SECURE:$name" in
    1:redis) start_secure_redis ;; 1:kafka) start_secure_kafka ;; 1:nessie-proxy) start_nessie_proxy ;;
  esac
  [[ "$SECURE" == 1 ]] && return
  case "$name" in
    redis) start_redis ;; kafka) start_kafka ;; nessie) start_nessie ;; prometheus) start_prometheus ;;
    lag-exporter) start_lag_exporter ;;
  esac
}

cmd_start() {
  local names=("$@"); ((${#names[@]})) || names=("${ALL_SERVICES[@]}")
  mkdir -p "$RUN_DIR"
  cmd_fetch
  local t0=$SECONDS n
  for n in "${names[@]}"; do start_one "$n"; done
  for n in "${names[@]}"; do
    wait_healthy "$n" "${CAUSEWAY_START_TIMEOUT:-120}"
    log "$n healthy on 127.0.0.1:$(service_port "$n")"
  done
  log "all healthy in $((SECONDS - t0))s; logs and pids in $RUN_DIR"
}

# ----------------------------------------------------------------------------------------- stop/status
cmd_stop() {
  local names=("$@"); ((${#names[@]})) || names=(lag-exporter prometheus nessie kafka redis)
  [[ "$SECURE" == 1 && $# -eq 0 ]] && names=(nessie-proxy kafka redis)
  local n pid i
  for n in "${names[@]}"; do
    if ! pid="$(our_pid "$n")"; then rm -f "$(pidfile "$n")"; continue; fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then log "$n did not stop in 30s; killing"; kill -KILL "$pid" || true; fi
    rm -f "$(pidfile "$n")"
    log "$n stopped"
  done
}

rss_mb() { awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }

cmd_status() {
  local n pid state rc=0
  for n in "${ALL_SERVICES[@]}"; do
    if pid="$(our_pid "$n")"; then
      if healthy "$n"; then state="healthy"; else state="unhealthy"; rc=1; fi
      printf '%-11s %-9s pid %-7s port %-6s rss %5s MiB  log %s\n' "$n" "$state" "$pid" \
        "$(service_port "$n")" "$(rss_mb "$pid")" "$(logfile "$n")"
    elif healthy "$n" 2>/dev/null; then
      printf '%-11s %-9s (not started by this script) port %s\n' "$n" "healthy" "$(service_port "$n")"
    else
      printf '%-11s %-9s\n' "$n" "stopped"; rc=1
    fi
  done
  return $rc
}

cmd_env() {
  if [[ "$SECURE" == 1 ]]; then secure_env; return; fi
  cat <<EOF
export CAUSEWAY_KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT
export CAUSEWAY_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export CAUSEWAY_NESSIE_URL=http://127.0.0.1:$NESSIE_PORT/api/v2
export CAUSEWAY_PROMETHEUS_URL=http://127.0.0.1:$PROMETHEUS_PORT
export CAUSEWAY_KAFKA_LIBS=$CACHE_DIR/kafka-$KAFKA_VERSION/libs
export CAUSEWAY_PROMETHEUS_SD_DIR=$SD_DIR
EOF
}

# shellcheck source=scripts/services-secure.sh
source "$ROOT/scripts/services-secure.sh"

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  restart) shift; cmd_stop "$@"; cmd_start "$@" ;;
  status) cmd_status ;;
  env) cmd_env ;;
  prometheus-config) prometheus_config ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
