"""Ray actors that run a job's ranks, and the training code they run.

Importing this package must stay cheap (the API imports `workers.model_configs` and
`workers.entrypoints` to validate submissions): torch is imported only by the modules
that train.
"""
