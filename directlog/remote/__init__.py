"""Tiered storage's shared pieces (docs/tiering.md): the remote store over pyarrow.fs, remote
data identifiers, and the remote index files that brokers read and tiering services write."""
