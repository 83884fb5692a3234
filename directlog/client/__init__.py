"""Directlog's Python clients: ``Producer``, ``Consumer`` and ``TopicPartition``, drop-ins
for confluent-kafka's that add the RDMA datapaths (``rdma.*`` configuration keys,
docs/client.md), and the single-partition RDMA clients they build on (rdma_produce.py,
rdma_consume.py)."""

from confluent_kafka import TopicPartition

from directlog.client.consumer import Consumer
from directlog.client.producer import Producer

__all__ = ["Consumer", "Producer", "TopicPartition"]
