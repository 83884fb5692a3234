"""Spark jobs on the `directlog` data source (directlog.spark): `pipelines.traffic`, the IoT
traffic pipeline of the KafkaDirect paper's §5.4."""
