"""The broker's RDMA datapaths (KafkaDirect §4): produce by WRITE_WITH_IMM into the head
segment (produce.py). docs/broker.md "RDMA produce" says how a client uses it."""
