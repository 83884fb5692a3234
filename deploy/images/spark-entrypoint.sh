#!/bin/bash
# The directlog/spark image's entrypoint, with the contract of Apache Spark's own
# (kubernetes/dockerfiles/spark/entrypoint.sh), so spark-submit --master k8s://... can start
# driver and executor pods from this image:
#   driver ARGS...    spark-submit --deploy-mode client ARGS... (Spark passes the rest)
#   executor          the KubernetesExecutorBackend JVM, from the SPARK_* variables the
#                     driver sets on executor pods
#   anything else     run as given (e.g. python -m pipelines.traffic.job --master local[*])
# SPARK_HOME is /opt/spark (pyspark's own tree: bin/, jars/); Python is the venv's.
set -euo pipefail

classpath="${SPARK_CLASSPATH:-}:${SPARK_HOME}/jars/*"
if [[ -n "${SPARK_EXTRA_CLASSPATH:-}" ]]; then
    classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
fi
if [[ -n "${HADOOP_CONF_DIR:-}" ]]; then
    classpath="$HADOOP_CONF_DIR:$classpath"
fi
classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$classpath:$PWD"

case "${1:-}" in
driver)
    shift
    exec tini -s -- "$SPARK_HOME/bin/spark-submit" \
        --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
        --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
        --deploy-mode client "$@"
    ;;
executor)
    shift
    # The driver hands JVM options over as SPARK_JAVA_OPT_0, _1, ... in order.
    java_opts=()
    while IFS= read -r name; do
        java_opts+=("${!name}")
    done < <(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n)
    exec tini -s -- java "${java_opts[@]}" \
        -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
        -cp "$classpath:${SPARK_DIST_CLASSPATH:-}" \
        org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "$SPARK_DRIVER_URL" \
        --executor-id "$SPARK_EXECUTOR_ID" \
        --cores "$SPARK_EXECUTOR_CORES" \
        --app-id "$SPARK_APPLICATION_ID" \
        --hostname "$SPARK_EXECUTOR_POD_IP" \
        --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
        --podName "${SPARK_EXECUTOR_POD_NAME:-}" \
        "$@"
    ;;
*)
    exec "$@"
    ;;
esac
