"""Entrypoint resolution shared by submit-time validation (API) and the rank actors."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class EntrypointError(ValueError):
    """The entrypoint cannot be used; the message says why in a user's words."""


def resolve_function(target: str) -> Callable[..., Any]:
    """Import `pkg.mod:fn` and return the callable, or raise EntrypointError."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise EntrypointError(f"target {target!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time error in user code makes the target unusable
        raise EntrypointError(f"cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise EntrypointError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise EntrypointError(f"{target!r} is not callable")
    return obj  # type: ignore[no-any-return]
