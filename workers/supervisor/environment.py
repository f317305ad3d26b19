"""The environment a rank sees: an allow-list, never the service's own.

The service holds secrets in its environment (`GANGWAY_ADMIN_KEY`, the database URL);
jobs are untrusted code (DESIGN principle 15). So every rank's process gets only what a
program, torch, NCCL and Ray need, plus the job's own `env`. The same filter scrubs the
environment the embedded Ray's raylets start with (they would hand it to every worker) and
the rank actor's own process (an external Ray's raylets may have been started with
anything).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# Exact names a program, a shell, Python and the C libraries read.
ALLOWED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "HOSTNAME",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
# Families that torch, CUDA, NCCL/gloo and Ray's worker processes configure themselves by.
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "TORCH_", "TORCHINDUCTOR_", "RAY_")
# Inside those families, what still must not reach user code: a Ray token lets its holder
# submit work to the cluster around Gangway.
DENIED_NAMES = frozenset({"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"})


def is_allowed(name: str) -> bool:
    if name in DENIED_NAMES:
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def scrubbed(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of `environ`."""
    return {name: value for name, value in environ.items() if is_allowed(name)}


def rank_environment(environ: Mapping[str, str], job_env: Mapping[str, str]) -> dict[str, str]:
    """What a rank's process runs with: the allow-listed part of `environ`, then the job's
    own variables (they win: the user asked for them)."""
    return {**scrubbed(environ), **job_env}


def scrub_process(job_env: Mapping[str, str]) -> None:
    """Make this process's environment a rank's (`rank_environment`), in place: function
    ranks run inside the actor's process."""
    keep = rank_environment(os.environ, job_env)
    os.environ.clear()
    os.environ.update(keep)


@contextmanager
def scrubbed_process() -> Iterator[None]:
    """Run the block with only the allow-listed environment, then restore it: child
    processes started inside it (the embedded Ray's GCS and raylets) inherit no secret."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(scrubbed(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
