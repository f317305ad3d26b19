"""Entrypoint resolution shared by submit-time validation (API) and the rank actors."""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.machinery
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
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
    tree = _named_module(module_name)
    if tree is not None:
        _check_head(tree, module_name, attr)


def _named_module(module_name: str) -> ast.Module | None:
    """The parsed source of the module a target names; None for a compiled one (accepted
    once found). EntrypointError when it cannot be found or read."""
    spec = _find_module(module_name)
    if spec is None:
        raise EntrypointError(f"cannot find module {module_name!r}")
    origin = spec.origin
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return _parse(origin)
    except (OSError, SyntaxError, ValueError) as exc:
        raise EntrypointError(f"cannot read module {module_name!r}: {exc}") from exc


def _parse(origin: str) -> ast.Module:
    return ast.parse(Path(origin).read_text(encoding="utf-8"), filename=origin)


def _check_head(tree: ast.Module, module_name: str, attr: str) -> None:
    if attr.partition(".")[0] not in _top_level_names(tree):
        raise EntrypointError(f"module {module_name!r} has no attribute {attr!r}")


def _find_module(name: str) -> ModuleSpec | None:
    """`importlib.util.find_spec` imports a dotted name's parents; this walks the path
    one package at a time instead, so no `__init__` runs."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level lookup imports nothing
    except ValueError:  # a loaded module without a spec: `__main__` of a console script
        return None
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


# -- where a target's object is defined (for the API's module policy) --------------------

# Imports a target may be followed through. Each step parses a module's source; real
# re-exports are a few steps deep, and a longer chain is refused, not followed.
MAX_IMPORT_HOPS = 8


class UnresolvedTarget(EntrypointError):
    """Where a target's object is defined cannot be told from source: a name bound only
    conditionally or by a star import from compiled code, an attribute a class inherits,
    an attribute of a value a call returned, too many imports deep. A policy that limits
    modules refuses such a target rather than guess."""


def defining_module(target: str, *, max_hops: int = MAX_IMPORT_HOPS) -> str:
    """The module that defines the object `pkg.mod:name.attr` names, told from source with
    `ast` and never by importing: a module may re-export anything it imports, so the
    policy must judge where the object really lives, not the module before the colon.

    `name` is followed through `import x`, `from x import y` (relative too), top-level
    aliases (`save = torch.save`) and star imports into the module that binds it; a
    dotted rest goes into submodules, or into a class defined there whose own body
    defines the attribute. A module without Python source (compiled, built in) ends the
    walk: the object is that module's. Raises EntrypointError where
    `check_function_target` would, UnresolvedTarget where the walk cannot go on."""
    module_name, attr = _split_target(target)
    tree = _named_module(module_name)
    if tree is None:
        return module_name
    _check_head(tree, module_name, attr)
    return _Walk(max_hops).attribute(module_name, attr.split("."))


# What a top-level statement binds a name to.
@dataclass(frozen=True)
class _Defined:
    """Defined here: a function, a class (its body kept) or a value computed here."""

    node: ast.stmt


@dataclass(frozen=True)
class _Alias:
    """`name = a.b.c`: the same object as the dotted path, in this module's scope."""

    path: tuple[str, ...]


@dataclass(frozen=True)
class _Module:
    """`import a.b` binds `a`; `import a.b as c` binds `c` to `a.b`."""

    name: str


@dataclass(frozen=True)
class _From:
    """`from module import name`: the module's attribute, or its submodule."""

    module: str
    name: str


@dataclass(frozen=True)
class _Star:
    """`from module import *`: may bind any name the module binds."""

    module: str


_Binding = _Defined | _Alias | _Module | _From | _Star


@dataclass
class _Walk:
    hops_left: int

    def attribute(self, module: str, parts: list[str]) -> str:
        """Where `module.<parts>` is defined; the module itself when no parts are left."""
        if not parts:
            return module
        found = self._source(module)
        if found is None:
            return module
        tree, package = found
        binding = self._binding(tree, package, parts[0])
        if binding is None:
            submodule = f"{module}.{parts[0]}"
            if _find_module(submodule) is not None:
                return self.attribute(submodule, parts[1:])
            raise UnresolvedTarget(
                f"module {module!r} binds {parts[0]!r} only conditionally or not at all"
            )
        return self._follow(module, binding, parts)

    def _follow(self, module: str, binding: _Binding, parts: list[str]) -> str:
        rest = parts[1:]
        if isinstance(binding, _Module):
            return self.attribute(binding.name, rest)
        if isinstance(binding, _From):
            return self.attribute(binding.module, [binding.name, *rest])
        if isinstance(binding, _Star):
            return self.attribute(binding.module, parts)
        if isinstance(binding, _Alias):
            return self._alias(module, [*binding.path, *rest])
        return self._defined(module, binding.node, parts)

    def _alias(self, module: str, path: list[str]) -> str:
        """A dotted value evaluated in `module`'s scope, where builtins are visible too."""
        found = self._source(module)
        bound = found is not None and path[0] in _top_level_names(found[0])
        if not bound and hasattr(builtins, path[0]):
            return "builtins"
        return self.attribute(module, path)

    def _defined(self, module: str, node: ast.stmt, parts: list[str]) -> str:
        """`parts[0]` is defined in `module` by `node`; a dotted rest must be a class's own."""
        if len(parts) == 1:
            return module
        if not isinstance(node, ast.ClassDef):
            raise UnresolvedTarget(
                f"{'.'.join(parts)!r}: {parts[0]!r} in module {module!r} is not a class, "
                "so what its attributes are is only known when it runs"
            )
        member = _class_member(node, parts[1])
        if member is None:
            raise UnresolvedTarget(
                f"{'.'.join(parts[:2])!r} is not defined in the body of class {parts[0]!r} "
                f"in module {module!r} (an inherited attribute lives where its base class does)"
            )
        if isinstance(member, _Alias):
            return self._alias(module, [*member.path, *parts[2:]])
        return self._defined(module, member.node, parts[1:])

    def _source(self, module: str) -> tuple[ast.Module, str] | None:
        """`module`'s parsed source and the package its relative imports start from; None
        for a module without Python source. Each call is one step of the walk."""
        self.hops_left -= 1
        if self.hops_left < 0:
            raise UnresolvedTarget(f"more than {MAX_IMPORT_HOPS} imports deep at {module!r}")
        spec = _find_module(module)
        if spec is None:
            raise UnresolvedTarget(f"cannot find module {module!r}")
        is_package = spec.submodule_search_locations is not None
        package = module if is_package else module.rpartition(".")[0]
        if spec.origin is None and is_package:  # a namespace package: no __init__
            return ast.Module(body=[], type_ignores=[]), package
        if spec.origin is None or not spec.origin.endswith(".py"):
            return None
        try:
            return _parse(spec.origin), package
        except (OSError, SyntaxError, ValueError) as exc:
            raise UnresolvedTarget(f"cannot read module {module!r}: {exc}") from exc

    def _binding(self, tree: ast.Module, package: str, name: str) -> _Binding | None:
        """What binds `name` last among the module's top-level statements (a star import
        counts when its module binds the name); None when nothing does unconditionally."""
        for node in reversed(tree.body):
            binding = _binds(node, package, name)
            if isinstance(binding, _Star) and not self._star_binds(binding.module, name):
                continue
            if binding is not None:
                return binding
        return None

    def _star_binds(self, module: str, name: str) -> bool:
        found = self._source(module)
        if found is None:
            raise UnresolvedTarget(
                f"{name!r} may come from a star import of compiled module {module!r}"
            )
        return self._binding(found[0], found[1], name) is not None


def _binds(node: ast.stmt, package: str, name: str) -> _Binding | None:
    """What the top-level statement `node` binds `name` to, if it binds it."""
    if isinstance(node, ast.Import):
        return _imported(node, name)
    if isinstance(node, ast.ImportFrom):
        return _imported_from(node, package, name)
    if isinstance(node, ast.Assign):
        named = any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        return _assigned(node) if named else None
    return _Defined(node) if _defines(node, name) else None


def _defines(node: ast.stmt, name: str) -> bool:
    """A def, class or annotated or augmented assignment of `name`."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _assigned(node: ast.Assign) -> _Defined | _Alias:
    """`x = a.b` aliases another object; any other value was made here."""
    path = _dotted(node.value)
    return _Alias(path) if path is not None else _Defined(node)


def _dotted(value: ast.expr) -> tuple[str, ...] | None:
    if isinstance(value, ast.Name):
        return (value.id,)
    if isinstance(value, ast.Attribute):
        head = _dotted(value.value)
        return (*head, value.attr) if head is not None else None
    return None


def _imported(node: ast.Import, name: str) -> _Module | None:
    for alias in node.names:
        if alias.asname == name:
            return _Module(alias.name)
        if alias.asname is None and alias.name.split(".")[0] == name:
            return _Module(name)
    return None


def _imported_from(node: ast.ImportFrom, package: str, name: str) -> _From | _Star | None:
    module = _absolute(node, package)
    for alias in node.names:
        if alias.name == "*":
            return _Star(module)
        if (alias.asname or alias.name) == name:
            return _From(module, alias.name)
    return None


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from` import names, its relative dots resolved against `package`."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".") if package else []
    base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    if not base:
        raise UnresolvedTarget(f"a relative import beyond the top-level package {package!r}")
    return ".".join([*base, node.module] if node.module else base)


def _class_member(node: ast.ClassDef, name: str) -> _Defined | _Alias | None:
    """What the class's own body binds `name` to (last binding wins)."""
    for statement in reversed(node.body):
        binding = _binds(statement, "", name)
        if isinstance(binding, _Defined | _Alias):
            return binding
        if binding is not None:  # an import inside a class body: rare, not followed
            return None
    return None
