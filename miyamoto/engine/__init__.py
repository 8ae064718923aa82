"""A node's own copies of tasks: the engine, the operations clients make on stored copies, the memory window and the timer heap."""
