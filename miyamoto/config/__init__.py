"""One validated, frozen configuration and the parsers of its values."""
