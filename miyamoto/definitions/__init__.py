"""Cluster-wide definitions (schedules, topics, queue settings): the pure machine, its I/O side, and what each kind means."""
