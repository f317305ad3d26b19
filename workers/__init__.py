"""Ray actors that run a job's ranks, and the training code they run.

Importing this package must stay cheap (the API imports `workers.engine.model_configs` and
`workers.program.entrypoints` to validate submissions): torch is imported only by the modules
that train.
"""
