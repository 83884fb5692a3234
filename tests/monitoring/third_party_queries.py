# ruff: noqa: E501
# (each expression stays on one line, exactly as its dashboard has it)
"""The PromQL of two dashboards Kafka users already run, kept as data: which series they read,
with which labels. tests/monitoring/test_dashboards.py runs every expression against a
Directlog cluster's Prometheus, with the variables filled as Grafana fills them, and expects
each to return data.

- Strimzi's Kafka dashboard: `examples/metrics/grafana-dashboards/strimzi-kafka.json` of
  github.com/strimzi/strimzi-kafka-operator (commit 964e714383df9c768bb729fd3ca8ba5c5b6515c1,
  schemaVersion 39). Its series come from Kafka's MBeans through the JMX exporter rules; its
  labels `namespace`, `strimzi_io_cluster` and `kubernetes_pod_name` from Strimzi's
  PodMonitor relabelling (pod labels `strimzi.io/*`, the namespace, the pod name).
- The Kafka Exporter Overview dashboard, Grafana 7589: `kafka_exporter_overview.json` of
  github.com/danielqsj/kafka_exporter (commit 92549857fe8168f3b509b1e2a9229e6e72887129). Its
  panels select one `instance`: the exporter's; Directlog's brokers export those series
  themselves, and a metric relabelling rule gives them one instance
  (services/broker/kafka_exporter.py).

Panels left out are listed in EXCLUDED with the reason: they read the JVM, the container or
the volume (cAdvisor, kubelet), or the process' file descriptors, none of which a Directlog
broker has or exports under those names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Variable:
    """A Grafana query variable: `query` is `label_values(...)` or `query_result(...)`;
    `regex` (Grafana's /.../ form) picks each value out of a result line; with
    `include_all` the panels get `all_value`, or Grafana's (a|b|c) of every value."""

    name: str
    query: str
    regex: str = ""
    include_all: bool = False
    all_value: str | None = None
    multi: bool = False


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    exprs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Dashboard:
    name: str
    source: str
    variables: tuple[Variable, ...]
    panels: tuple[Panel, ...]


STRIMZI_KAFKA = Dashboard(
    "strimzi-kafka",
    "strimzi/strimzi-kafka-operator examples/metrics/grafana-dashboards/strimzi-kafka.json",
    variables=(
        Variable(
            "kubernetes_namespace",
            "query_result(kafka_server_replicamanager_leadercount)",
            regex='/.*namespace="([^"]*).*/',
        ),
        Variable(
            "strimzi_cluster_name",
            'query_result(kafka_server_replicamanager_leadercount{namespace="$kubernetes_namespace"})',
            regex='/.*strimzi_io_cluster="([^"]*).*/',
        ),
        Variable(
            "kafka_broker",
            'query_result(kafka_server_replicamanager_leadercount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            regex='/.*pod_name="$strimzi_cluster_name-([^"]*).*/',
            include_all=True,
            all_value=".*",
        ),
        Variable(
            "kafka_topic",
            'query_result(kafka_cluster_partition_replicascount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"})',
            regex='/.*topic="([^"]*).*/',
            include_all=True,
            all_value=".+",
        ),
        Variable(
            "kafka_partition",
            'query_result(kafka_log_log_size{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker",topic=~"$kafka_topic"})',
            regex='/.*partition="([^"]*).*/',
            include_all=True,
            all_value=".*",
            multi=True,
        ),
    ),
    panels=(
        # strimzi-kafka.json, panel 'Brokers Online'
        Panel(
            "Brokers Online",
            (
                'count(kafka_server_replicamanager_leadercount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Active Controllers'
        Panel(
            "Active Controllers",
            (
                'sum(kafka_controller_kafkacontroller_activecontrollercount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Unclean Leader Election Rate'
        Panel(
            "Unclean Leader Election Rate",
            (
                'sum(irate(kafka_controller_controllerstats_uncleanleaderelections_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Online Replicas'
        Panel(
            "Online Replicas",
            (
                'sum(kafka_server_replicamanager_partitioncount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Under Replicated Partitions'
        Panel(
            "Under Replicated Partitions",
            (
                'sum(kafka_server_replicamanager_underreplicatedpartitions{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Partitions at minimum ISR'
        Panel(
            "Partitions at minimum ISR",
            (
                'sum(kafka_cluster_partition_atminisr{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Partitions under minimum ISR'
        Panel(
            "Partitions under minimum ISR",
            (
                'sum(kafka_cluster_partition_underminisr{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Offline Partitions Count'
        Panel(
            "Offline Partitions Count",
            (
                'sum(kafka_controller_kafkacontroller_offlinepartitionscount{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name"})',
            ),
        ),
        # strimzi-kafka.json, panel 'Total Incoming Byte Rate'
        Panel(
            "Total Incoming Byte Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_bytesin_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Total Outgoing Byte Rate'
        Panel(
            "Total Outgoing Byte Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_bytesout_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Incoming Messages Rate'
        Panel(
            "Incoming Messages Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_messagesin_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Total Produce Request Rate'
        Panel(
            "Total Produce Request Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_totalproducerequests_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Byte Rate'
        Panel(
            "Byte Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_bytesin_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
                'sum(irate(kafka_server_brokertopicmetrics_bytesout_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Messages In Per Second'
        Panel(
            "Messages In Per Second",
            (
                'sum(irate(kafka_server_brokertopicmetrics_messagesin_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Produce Request Rate'
        Panel(
            "Produce Request Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_totalproducerequests_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
                'sum(irate(kafka_server_brokertopicmetrics_failedproducerequests_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Fetch Request Rate'
        Panel(
            "Fetch Request Rate",
            (
                'sum(irate(kafka_server_brokertopicmetrics_totalfetchrequests_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
                'sum(irate(kafka_server_brokertopicmetrics_failedfetchrequests_total{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",topic=~"$kafka_topic",topic!="",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m]))',
            ),
        ),
        # strimzi-kafka.json, panel 'Network Processor Avg Idle Percent'
        Panel(
            "Network Processor Avg Idle Percent",
            (
                'sum(kafka_network_socketserver_networkprocessoravgidle_percent{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}*100) by (kubernetes_pod_name)',
            ),
        ),
        # strimzi-kafka.json, panel 'Request Handler Avg Idle Percent'
        Panel(
            "Request Handler Avg Idle Percent",
            (
                'sum(kafka_server_kafkarequesthandlerpool_requesthandleravgidle_percent{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}*100) by (kubernetes_pod_name)',
            ),
        ),
        # strimzi-kafka.json, panel 'Disk Writes'
        Panel(
            "Disk Writes",
            (
                'sum(irate(kafka_server_kafkaserver_linux_disk_write_bytes{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m])) by (kubernetes_pod_name)',
            ),
        ),
        # strimzi-kafka.json, panel 'Disk Reads'
        Panel(
            "Disk Reads",
            (
                'sum(irate(kafka_server_kafkaserver_linux_disk_read_bytes{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}[5m])) by (kubernetes_pod_name)',
            ),
        ),
        # strimzi-kafka.json, panel 'Connection Count per Listener'
        Panel(
            "Connection Count per Listener",
            (
                'sum(kafka_server_socket_server_metrics_connection_count{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker"}) by (kubernetes_pod_name, listener)',
            ),
        ),
        # strimzi-kafka.json, panel 'Log Size'
        Panel(
            "Log Size",
            (
                'kafka_log_log_size{namespace="$kubernetes_namespace",strimzi_io_cluster="$strimzi_cluster_name",kubernetes_pod_name=~"$strimzi_cluster_name-$kafka_broker",topic=~"$kafka_topic",partition=~"$kafka_partition"}',
            ),
        ),
    ),
)

KAFKA_EXPORTER_OVERVIEW = Dashboard(
    "kafka-exporter-overview",
    "danielqsj/kafka_exporter kafka_exporter_overview.json (Grafana 7589)",
    variables=(
        Variable(
            "job",
            "label_values(kafka_consumergroup_current_offset, job)",
        ),
        Variable(
            "instance",
            'label_values(kafka_consumergroup_current_offset{job=~"$job"}, instance)',
        ),
        Variable(
            "topic",
            "label_values(kafka_topic_partition_current_offset{instance='$instance',topic!='__consumer_offsets',topic!='--kafka'}, topic)",
            include_all=True,
            multi=True,
        ),
    ),
    panels=(
        # kafka_exporter_overview.json, panel 'Message in per second'
        Panel(
            "Message in per second",
            (
                'sum(rate(kafka_topic_partition_current_offset{instance="$instance", topic=~"$topic"}[1m])) by (topic)',
            ),
        ),
        # kafka_exporter_overview.json, panel 'Lag by  Consumer Group'
        Panel(
            "Lag by  Consumer Group",
            (
                'sum(kafka_consumergroup_lag{instance="$instance",topic=~"$topic"}) by (consumergroup, topic)',
            ),
        ),
        # kafka_exporter_overview.json, panel 'Message in per minute'
        Panel(
            "Message in per minute",
            (
                "sum(delta(kafka_topic_partition_current_offset{instance=~'$instance', topic=~\"$topic\"}[5m])/5) by (topic)",
            ),
        ),
        # kafka_exporter_overview.json, panel 'Message consume per minute'
        Panel(
            "Message consume per minute",
            (
                "sum(delta(kafka_consumergroup_current_offset{instance=~'$instance',topic=~\"$topic\"}[5m])/5) by (consumergroup, topic)",
            ),
        ),
        # kafka_exporter_overview.json, panel 'Partitions per Topic'
        Panel(
            "Partitions per Topic",
            ('sum by(topic) (kafka_topic_partitions{instance="$instance",topic=~"$topic"})',),
        ),
    ),
)

DASHBOARDS = (STRIMZI_KAFKA, KAFKA_EXPORTER_OVERVIEW)

# Panels of those dashboards not run, and why.
EXCLUDED = {
    "strimzi-kafka": {
        "Memory Usage": "container_memory_usage_bytes: cAdvisor's, of the container",
        "CPU Usage": "container_cpu_usage_seconds_total: cAdvisor's, of the container",
        "Available Disk Space": "kubelet_volume_stats_available_bytes: the kubelet's, of the volume",
        "Open File Descriptors": "process_open_fds: the JVM process collector's (OS)",
        "JVM Memory Used": "jvm_memory_used_bytes: the JVM's",
        "JVM GC Time": "jvm_gc_collection_seconds_sum: the JVM's",
        "JVM GC Count": "jvm_gc_collection_seconds_count: the JVM's",
        "JVM Thread Count": "jvm_threads_current: the JVM's",
    },
    "kafka-exporter-overview": {},
}
