"""A PySpark data source for Directlog topics, format `directlog`: the schema and options
of Spark's Kafka connector, in Python, with no jar (docs/spark.md).

    from directlog.spark import DirectlogSource
    spark.dataSource.register(DirectlogSource)
    df = spark.read.format("directlog").option("kafka.bootstrap.servers", "host:9092") \\
        .option("subscribe", "events").load()
"""

from directlog.spark.source import DirectlogSource

__all__ = ["DirectlogSource"]
