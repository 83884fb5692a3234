"""The tiering service (KIP-405's remote log manager): one beside every broker, copying the
closed segments of tiered topics to the remote store and keeping the remote indexes."""
