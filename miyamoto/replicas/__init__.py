"""The pure sibling protocol: where a task's copies live, which copy may deliver (asking and claims), restoring lost copies, and the effects it asks for."""
