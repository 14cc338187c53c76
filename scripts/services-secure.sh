# The secured local stack, sourced by scripts/services.sh (run `scripts/services.sh --secure start`).
#
# At first start it generates, under $RUN_DIR (mode 700):
#   tls/ca.{crt,key}          a throwaway CA (openssl), and tls/server.{crt,key,p12} signed by it for
#                             127.0.0.1 and localhost (Kafka, Redis and the Nessie proxy share it)
#   tls/client.{crt,key}      a client certificate for mutual TLS (CN=causeway); the key is encrypted
#                             with CLIENT_KEY_PASSWORD
#   secrets.env               random passwords and tokens (mode 600), read by `env` and the tests
# Kafka: a SASL_SSL listener with SCRAM-SHA-256/512 users `causeway` and `admin` created at storage
# format time, PLAIN (the same user and password, from the broker's JAAS config) and OAUTHBEARER checked by
# Kafka's unsecured-JWS validator (a test setup: it accepts any unsigned token with `sub` and `exp`; never
# in production); and an SSL listener on $KAFKA_MTLS_PORT that requires a client certificate signed by the
# CA (the KRaft controller listener stays on 127.0.0.1 in plaintext: it is not a client port).
# Redis: TLS only (no plaintext port), `requirepass` for the default user plus an ACL user `causeway`.
# Nessie: scripts/nessie_token_proxy.py over HTTPS in front of $NESSIE_UPSTREAM: static bearer token or
# OAuth2 client credentials (`POST /oauth/token`); requests without a valid token never reach Nessie.
# Secrets go into files (config, JAAS), never onto a command line, except the one-off storage format.

secret_value() { sed -n "s/^$1=//p" "$SECRETS_FILE"; }

# A secret added by a later version of this script joins an existing secrets.env.
ensure_secret() {
  grep -q "^$1=" "$SECRETS_FILE" || (umask 077 && echo "$1=$(openssl rand -hex 16)" >>"$SECRETS_FILE")
}

secure_setup() {
  mkdir -p "$RUN_DIR" "$TLS_DIR"
  chmod 700 "$RUN_DIR"
  if [[ ! -f "$SECRETS_FILE" ]]; then
    local r; r() { openssl rand -hex 16; }
    umask 077
    cat >"$SECRETS_FILE" <<EOF
KAFKA_USER=causeway
KAFKA_PASSWORD=$(r)
KAFKA_ADMIN_PASSWORD=$(r)
REDIS_PASSWORD=$(r)
REDIS_USER=causeway
REDIS_USER_PASSWORD=$(r)
NESSIE_TOKEN=$(r)
NESSIE_CLIENT_ID=causeway
NESSIE_CLIENT_SECRET=$(r)
TLS_STORE_PASSWORD=$(r)
EOF
    umask 022
  fi
  ensure_secret CLIENT_KEY_PASSWORD
  if [[ ! -f "$TLS_DIR/server.p12" ]]; then
    log "secure: generating a CA and a server certificate for 127.0.0.1/localhost in $TLS_DIR"
    (
      cd "$TLS_DIR" && umask 077
      openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=causeway local test CA" \
        -keyout ca.key -out ca.crt 2>/dev/null
      openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
      openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile server.ext -out server.crt 2>/dev/null
      openssl pkcs12 -export -in server.crt -inkey server.key -name server -out server.p12 \
        -passout "file:"<(secret_value TLS_STORE_PASSWORD) 2>/dev/null
      chmod 644 ca.crt server.crt
    ) || die "secure: certificate generation failed (openssl)"
  fi
  if [[ ! -f "$TLS_DIR/client.crt" ]]; then
    log "secure: generating a client certificate (CN=causeway) for mutual TLS in $TLS_DIR"
    (
      cd "$TLS_DIR" && umask 077
      openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -aes256 \
        -pass "file:"<(secret_value CLIENT_KEY_PASSWORD) -out client.key 2>/dev/null
      openssl req -new -key client.key -passin "file:"<(secret_value CLIENT_KEY_PASSWORD) \
        -subj "/CN=causeway" -out client.csr 2>/dev/null
      printf 'extendedKeyUsage=clientAuth\n' >client.ext
      openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile client.ext -out client.crt 2>/dev/null
      chmod 644 client.crt
    ) || die "secure: client certificate generation failed (openssl)"
  fi
}

secure_healthy() {
  case "$1" in
    redis) REDISCLI_AUTH="$(secret_value REDIS_PASSWORD)" redis-cli --tls --cacert "$TLS_DIR/ca.crt" \
             -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG ;;
    kafka) port_open "$KAFKA_PORT" && grep -q "Kafka Server started" "$(logfile kafka)" 2>/dev/null ;;
    nessie-proxy) curl -fsS -m 3 -o /dev/null --cacert "$TLS_DIR/ca.crt" \
                    "https://127.0.0.1:$NESSIE_PROXY_PORT/healthz" 2>/dev/null ;;
    *) die "unknown secured service '$1' (known: ${ALL_SERVICES[*]})" ;;
  esac
}

start_secure_redis() {
  mkdir -p "$RUN_DIR/redis-data"
  local conf="$RUN_DIR/redis.conf"
  (umask 077 && cat >"$conf" <<EOF
port 0
bind 127.0.0.1
tls-port $REDIS_PORT
tls-cert-file $TLS_DIR/server.crt
tls-key-file $TLS_DIR/server.key
tls-ca-cert-file $TLS_DIR/ca.crt
tls-auth-clients no
requirepass $(secret_value REDIS_PASSWORD)
user $(secret_value REDIS_USER) on >$(secret_value REDIS_USER_PASSWORD) ~* &* +@all
dir $RUN_DIR/redis-data
save ""
appendonly no
daemonize no
pidfile $RUN_DIR/redis.server.pid
logfile ""
EOF
  )
  launch redis redis-server "$conf"
}

start_secure_kafka() {
  local dir="$CACHE_DIR/kafka-$KAFKA_VERSION" data="$RUN_DIR/kafka-data" conf="$RUN_DIR/kafka.properties"
  local user pw admin_pw store_pw
  user="$(secret_value KAFKA_USER)" pw="$(secret_value KAFKA_PASSWORD)"
  admin_pw="$(secret_value KAFKA_ADMIN_PASSWORD)" store_pw="$(secret_value TLS_STORE_PASSWORD)"
  mkdir -p "$data"
  local jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"$admin_pw\";"
  local plain="org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$admin_pw\" user_admin=\"$admin_pw\" user_$user=\"$pw\";"
  # No server callback handler: Kafka checks OAUTHBEARER tokens with its unsecured-JWS validator.
  local oauth="org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub=\"admin\";"
  (umask 077 && cat >"$conf" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$KAFKA_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=$jaas
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=$jaas
listener.name.sasl_ssl.plain.sasl.jaas.config=$plain
listener.name.sasl_ssl.oauthbearer.sasl.jaas.config=$oauth
listener.name.ssl.ssl.client.auth=required
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/server.p12
ssl.keystore.password=$store_pw
ssl.key.password=$store_pw
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.crt
ssl.client.auth=none
log.dirs=$data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
EOF
  )
  local cp="$dir/libs/*" log4j="$RUN_DIR/kafka-log4j.properties"
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
    # SCRAM credentials are written into the metadata log at format time (KRaft has no ZooKeeper).
    java -cp "$cp" -Dlog4j.configuration="file:$log4j" kafka.tools.StorageTool format -t "$cluster_id" -c "$conf" \
      --add-scram "SCRAM-SHA-512=[name=admin,password=$admin_pw]" \
      --add-scram "SCRAM-SHA-512=[name=$user,password=$pw]" \
      --add-scram "SCRAM-SHA-256=[name=$user,password=$pw]" >"$RUN_DIR/kafka-format.log" 2>&1 \
      || die "kafka (secure): storage format failed; see $RUN_DIR/kafka-format.log"
  fi
  # shellcheck disable=SC2086
  launch kafka java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$log4j" -Dcauseway.run.dir="$RUN_DIR" -cp "$cp" kafka.Kafka "$conf"
}

start_nessie_proxy() {
  [[ -x "$PYTHON" ]] || die "nessie-proxy: no Python at $PYTHON (set CAUSEWAY_PYTHON)"
  (
    export CAUSEWAY_PROXY_PORT="$NESSIE_PROXY_PORT" CAUSEWAY_PROXY_UPSTREAM="$NESSIE_UPSTREAM"
    export CAUSEWAY_PROXY_CERT="$TLS_DIR/server.crt" CAUSEWAY_PROXY_KEY="$TLS_DIR/server.key"
    export CAUSEWAY_PROXY_SECRETS="$SECRETS_FILE"
    launch nessie-proxy "$PYTHON" "$ROOT/scripts/nessie_token_proxy.py"
  )
}

secure_env() {
  [[ -f "$SECRETS_FILE" ]] || die "no $SECRETS_FILE yet: run scripts/services.sh --secure start"
  cat <<EOF
export CAUSEWAY_KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT
export CAUSEWAY_KAFKA_SECURITY_PROTOCOL=SASL_SSL
export CAUSEWAY_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
export CAUSEWAY_KAFKA_SASL_USERNAME=$(secret_value KAFKA_USER)
export CAUSEWAY_KAFKA_SASL_PASSWORD=$(secret_value KAFKA_PASSWORD)
export CAUSEWAY_KAFKA_SSL_CA_FILE=$TLS_DIR/ca.crt
export CAUSEWAY_REDIS_URL=rediss://127.0.0.1:$REDIS_PORT/0
export CAUSEWAY_REDIS_USERNAME=$(secret_value REDIS_USER)
export CAUSEWAY_REDIS_PASSWORD=$(secret_value REDIS_USER_PASSWORD)
export CAUSEWAY_REDIS_CA_FILE=$TLS_DIR/ca.crt
export CAUSEWAY_NESSIE_URL=https://127.0.0.1:$NESSIE_PROXY_PORT/api/v2
export CAUSEWAY_NESSIE_CA_FILE=$TLS_DIR/ca.crt
export CAUSEWAY_NESSIE_OAUTH_TOKEN_URL=https://127.0.0.1:$NESSIE_PROXY_PORT/oauth/token
export CAUSEWAY_NESSIE_OAUTH_CLIENT_ID=$(secret_value NESSIE_CLIENT_ID)
export CAUSEWAY_NESSIE_OAUTH_CLIENT_SECRET=$(secret_value NESSIE_CLIENT_SECRET)
EOF
  # Not client settings: where a mutual-TLS client connects, and its certificate (for tests and docs).
  cat <<EOF
export CAUSEWAY_SECURE_KAFKA_MTLS_BOOTSTRAP=127.0.0.1:$KAFKA_MTLS_PORT
export CAUSEWAY_SECURE_CLIENT_CERT=$TLS_DIR/client.crt
export CAUSEWAY_SECURE_CLIENT_KEY=$TLS_DIR/client.key
export CAUSEWAY_SECURE_CLIENT_KEY_PASSWORD=$(secret_value CLIENT_KEY_PASSWORD)
EOF
}
