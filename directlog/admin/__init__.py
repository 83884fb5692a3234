"""The `directlog` admin command line: topics, consumer groups, brokers, replica
reassignments and leader elections, all over the Kafka protocol (docs/admin.md).

`plans` holds the pure placement planning (drain, rebalance, plan files); the other
modules are one command area each, on the connection in `session`.
"""
