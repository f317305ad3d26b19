"""Gangway's HTTP service: FastAPI app factory, routes, errors and the status page."""
