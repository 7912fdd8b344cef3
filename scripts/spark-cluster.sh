#!/usr/bin/env bash
# A Spark standalone cluster on loopback from the installed PySpark: one master
# (spark://127.0.0.1:7077) and two workers of one core each, every daemon its own JVM.
# For trying the pulsarcast data source beyond local[*] (docs/spark.md, "A standalone
# cluster"); not for production.
#
#   scripts/spark-cluster.sh start    # returns once both workers are registered
#   scripts/spark-cluster.sh stop
#
# PYTHON (default: python3 on PATH) is the interpreter whose PySpark is used and that
# executors run; RUN_DIR (default /tmp/pulsarcast-spark-cluster) holds logs and pid files.
set -euo pipefail

PYTHON=${PYTHON:-python3}
RUN_DIR=${RUN_DIR:-/tmp/pulsarcast-spark-cluster}
SPARK_HOME=$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
export SPARK_HOME
# Bind every daemon to loopback: without it Spark picks the address of the host name,
# which on many machines is not where the driver listens (see docs/spark.md).
export SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v "$PYTHON")}
MASTER=spark://127.0.0.1:7077

wait_for() {  # wait_for <seconds> <description> <command...>: poll with a deadline
    local deadline=$((SECONDS + $1)) what=$2; shift 2
    until "$@"; do
        if ((SECONDS > deadline)); then
            echo "spark-cluster: $what did not happen within the deadline; see $RUN_DIR" >&2
            exit 1
        fi
        sleep 0.2
    done
}

start_daemon() {  # start_daemon <name> <class> <args...>
    local name=$1; shift
    nohup "$SPARK_HOME/bin/spark-class" "$@" >"$RUN_DIR/$name.log" 2>&1 &
    echo $! >"$RUN_DIR/$name.pid"
}

registered() { [ "$(grep -c 'Registering worker' "$RUN_DIR/master.log" 2>/dev/null)" -ge 2 ]; }
listening() { (exec 3<>/dev/tcp/127.0.0.1/7077) 2>/dev/null; }

case ${1:-} in
start)
    mkdir -p "$RUN_DIR"
    start_daemon master org.apache.spark.deploy.master.Master \
        --host 127.0.0.1 --port 7077 --webui-port 8080
    wait_for 60 "the master listening on 7077" listening
    for i in 1 2; do
        start_daemon "worker$i" org.apache.spark.deploy.worker.Worker \
            --host 127.0.0.1 --cores 1 --memory 1g --webui-port "808$i" \
            --work-dir "$RUN_DIR/work$i" "$MASTER"
    done
    wait_for 90 "two workers registering" registered
    echo "spark-cluster: $MASTER up (master and 2 workers, logs in $RUN_DIR)"
    ;;
stop)
    for name in worker1 worker2 master; do
        if [ -f "$RUN_DIR/$name.pid" ]; then
            kill "$(cat "$RUN_DIR/$name.pid")" 2>/dev/null || true
            rm -f "$RUN_DIR/$name.pid"
        fi
    done
    echo "spark-cluster: stopped"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
