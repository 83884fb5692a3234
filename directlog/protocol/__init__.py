"""The Kafka wire protocol: framing, headers, the API table and error codes.

Message bodies are encoded and decoded by kafka-python's protocol module, which is generated
from Apache Kafka's own JSON message definitions and covers every version from 0. Only the
Fetch response, whose records are sent from segment files with sendfile, is laid out here.
"""
