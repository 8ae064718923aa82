"""The cluster layer: the I/O that carries out what the machines decide (storing copies, cluster-wide queries, requests, clocks)."""
