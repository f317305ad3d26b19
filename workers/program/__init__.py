"""The rank program: the user's side of the boundary, run as a sandboxed child of the rank
supervisor (the built-in trainer, functions, scripts and commands)."""
