"""Kafka transactions (KIP-98): the transaction coordinator and `__transaction_state`."""
