"""The broker's side of tiered storage (KIP-405, docs/tiering.md): reads of remote records,
a follower's restart from remote state, and the gRPC service its tiering service calls."""
