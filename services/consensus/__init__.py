"""The consensus service: a ZAB ensemble that serves the ZooKeeper client protocol."""
