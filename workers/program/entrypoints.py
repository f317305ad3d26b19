"""Entrypoint resolution shared by submit-time validation (API) and the rank actors."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any


class EntrypointError(ValueError):
    """The entrypoint cannot be used; the message says why in a user's words."""


def _split_target(target: str) -> tuple[str, str]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise EntrypointError(f"target {target!r} must look like 'package.module:function'")
    return module_name, attr


def check_function_target(target: str) -> None:
    """Check that `pkg.mod:fn` names a module and a top-level name in it, WITHOUT importing
    anything: the API must never run user code (a module's import-time effects) in the
    service's process. The module is found on the path and its source parsed with `ast`;
    a compiled module is accepted once found."""
    module_name, attr = _split_target(target)
    spec = _find_module(module_name)
    if spec is None:
        raise EntrypointError(f"cannot find module {module_name!r}")
    origin = spec.origin
    if origin is None or not origin.endswith(".py"):
        return
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"), filename=origin)
    except (OSError, SyntaxError, ValueError) as exc:
        raise EntrypointError(f"cannot read module {module_name!r}: {exc}") from exc
    head = attr.split(".")[0]
    if head not in _top_level_names(tree):
        raise EntrypointError(f"module {module_name!r} has no attribute {attr!r}")


def _find_module(name: str) -> ModuleSpec | None:
    """`importlib.util.find_spec` imports a dotted name's parents; this walks the path
    one package at a time instead, so no `__init__` runs."""
    parts = name.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level lookup imports nothing
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if locations is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    return spec


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def resolve_function(target: str) -> Callable[..., Any]:
    """Import `pkg.mod:fn` and return the callable, or raise EntrypointError (on a rank)."""
    module_name, attr = _split_target(target)
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
