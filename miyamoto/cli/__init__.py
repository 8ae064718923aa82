"""The `miyamoto` command: serve, keygen, and the client commands."""
