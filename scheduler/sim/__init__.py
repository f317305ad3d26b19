"""Trace-driven simulation of the scheduling core (the very code the service runs)."""
