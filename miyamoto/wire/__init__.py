"""Bytes between nodes: the verbs, the typed-message registry and its field checks, the ZeroMQ transport and the outbox."""
