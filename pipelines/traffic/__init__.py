"""The IoT traffic pipeline of the KafkaDirect paper (SIGMOD'22, §5.4), on directlog.spark.

Road sensors, one per lane of each location, measure how many cars passed and their
average speed; each measurement is published as two JSON events, one in a counts topic and
one in a speeds topic (events.py, sensors.py). A PySpark Structured Streaming job (job.py)
reads both topics through the `directlog` data source, joins each lane's count and speed
of the same measurement time, totals them per location over event-time windows, writes
the totals to an output topic, and records every event's delay from its creation to the
micro-batch that read it in a delays topic. `python -m pipelines.traffic` runs the sensors
and the job together against a cluster and prints the delay percentiles (__main__.py).

    python -m pipelines.traffic --bootstrap 127.0.0.1:9092 --rate 400 --seconds 60
    python -m pipelines.traffic.sensors --bootstrap 127.0.0.1:9092 --workload burst
    python -m pipelines.traffic.job --bootstrap 127.0.0.1:9092 --checkpoint /tmp/traffic
"""
