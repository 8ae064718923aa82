"""Cluster-wide definitions (schedules, topics): the pure machine, its I/O side, and what schedules and topics mean."""
