"""Kafka record formats: record batch v2 and the legacy message sets (magic 0 and 1)."""
