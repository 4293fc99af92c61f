#!/bin/bash
# The entry point of the airlock/kafka image: one KRaft node (broker and controller) whose
# server properties come from KAFKA_* variables, as the apache/kafka image takes them
# (KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://localhost:9092 sets advertised.listeners). Formats
# the data directory on first start, then runs the broker in the foreground (its log on stdout).
set -euo pipefail

props=/opt/kafka/server.properties
{
  echo "process.roles=broker,controller"
  echo "node.id=1"
  echo "controller.quorum.voters=1@localhost:9093"
  echo "listeners=PLAINTEXT://:9092,CONTROLLER://:9093"
  echo "advertised.listeners=PLAINTEXT://localhost:9092"
  echo "controller.listener.names=CONTROLLER"
  echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  echo "log.dirs=/var/lib/kafka/data"
  echo "offsets.topic.replication.factor=1"
  echo "offsets.topic.num.partitions=5"
  echo "transaction.state.log.replication.factor=1"
  echo "transaction.state.log.min.isr=1"
  echo "transaction.state.log.num.partitions=5"
  echo "group.initial.rebalance.delay.ms=0"
  echo "group.min.session.timeout.ms=1000"
  # Later lines win: every KAFKA_FOO_BAR=value becomes foo.bar=value.
  env | while IFS='=' read -r name value; do
    case "$name" in
      KAFKA_HEAP|KAFKA_JVM_OPTS) ;;
      KAFKA_*) echo "$(echo "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')=$value" ;;
    esac
  done
} >"$props"

cp=(-cp "/opt/kafka/libs/*" -Dlog4j2.configurationFile=/opt/kafka/log4j2.yaml)
jvm=(-Xms128m "-Xmx${KAFKA_HEAP:-768m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError)
if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  cluster="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  java "${jvm[@]}" "${cp[@]}" kafka.tools.StorageTool format -t "$cluster" -c "$props"
fi
exec java "${jvm[@]}" "${cp[@]}" kafka.Kafka "$props"
