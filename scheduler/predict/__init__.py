"""Predictions the scheduling core consumes: run times of opaque jobs from this cluster's
history (`runtime`), and step times of the built-in trainer from the work per step
(`steptime`). Pure: no I/O, no clock; the caller feeds history and reads estimates."""
