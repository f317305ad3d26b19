"""The runtime: the scheduling loop and its edges to Ray (cluster source, executor)."""
