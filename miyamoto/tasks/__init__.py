"""The task record and everything that checks one: its states, the enqueue validation, the dispatch fields, content de-duplication."""
