"""The training engine the rank program runs: model, parallelism, checkpoints, updates.

Importing the package is cheap: torch is imported by the modules that train, so the API
can import the torch-free ones (`plan`, `model_configs`)."""
