"""Gangway's scheduler: domain model, pure policy core, SQL store and the runtime loop."""
