"""The service side of a gang: its placement group, its rank supervisors on Ray, polling."""
