"""The durable record: the SQLite journal, its file and rows, its database thread, and the data dir's lock."""
