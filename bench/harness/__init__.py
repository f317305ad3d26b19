"""What benchmarks and tests both run on: `gangway serve` as a subprocess (`service`),
the fault cases' service, job and waits (`faults`) and their invariant checker
(`invariants`), the training engine on local gloo processes (`engine`), and the model
as older releases saved it (`older_models`).

Why here and not in `tests/`: a benchmark that imports test code depends on the test
suite's layout, and the test suite would hold code that is not a test. The top-level
folders are fixed, and benchmarks are the other user, so the shared code is a package
of `bench/` that `tests/` imports; it ships in no wheel (setuptools packages only
gangway, api, scheduler, workers and migrations).
"""
