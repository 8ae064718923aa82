"""The CLI's usage error: a bad argument the parser could not catch (exit 2)."""


class UsageError(Exception):
    """A bad argument the parser could not catch (exit 2)."""
