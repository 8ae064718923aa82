"""Cluster membership and leader election as a pure state machine: the roster, elections, leadership, liveness, roster changes, bootstrap, and their messages."""
