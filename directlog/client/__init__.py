"""Directlog's Python clients: the RDMA producer (rdma_produce.py)."""
