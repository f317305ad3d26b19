"""Entrypoint resolution shared by submit-time validation (API) and the rank actors."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any


class EntrypointError(ValueError):
    """The entrypoint cannot be used; the message says why in a user's words."""


def _split(target: str) -> tuple[str, str]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise EntrypointError(f"target {target!r} must look like 'package.module:function'")
    return module_name, attr


def check_function(target: str) -> None:
    """Check `pkg.mod:fn` without running any of its code (the API process must never
    import user code): find the module's source with the path finder, one package level
    at a time (`importlib.util.find_spec` would import the parent packages), and look for
    a top-level definition or assignment of the name in its syntax tree."""
    module_name, attr = _split(target)
    spec = _find_spec(module_name)
    if spec is None or spec.origin is None:
        raise EntrypointError(f"no module named {module_name!r}")
    if not spec.origin.endswith(".py"):
        return  # compiled or built in: nothing to read, the rank will import it
    try:
        with open(spec.origin, encoding="utf-8") as source:
            tree = ast.parse(source.read(), filename=spec.origin)
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise EntrypointError(f"cannot read module {module_name!r}: {exc}") from exc
    if attr.split(".")[0] not in _top_level_names(tree):
        raise EntrypointError(f"module {module_name!r} has no attribute {attr!r}")


def _find_spec(module_name: str) -> ModuleSpec | None:
    search: list[str] | None = None
    spec: ModuleSpec | None = None
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.builtin_module_names:
            return None if depth < len(parts) else ModuleSpec(name, None, origin="built-in")
        spec = PathFinder.find_spec(name, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return spec


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def resolve_function(target: str) -> Callable[..., Any]:
    """Import `pkg.mod:fn` and return the callable, or raise EntrypointError. Ranks only:
    importing runs the module's code."""
    module_name, attr = _split(target)
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
