"""Admin submit policy: which entrypoint kinds each role may use, where code that was not
shipped with the job may come from. Checked at submit; a refusal is a 403 naming the field.

Code shipped in a job's own package (its working directory) is the user's to run; what the
policy guards is code already on the cluster's hosts: any script file, any importable
module. With auth on the default allows none of it but the bundled examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from api.auth import Forbidden, Principal
from api.errors import FieldError
from gangway.models import Command, Function, JobSubmit, Script
from workers.program.entrypoints import EntrypointError, UnresolvedTarget, defining_module

KINDS = frozenset({"builtin", "function", "script", "command"})
# Function modules a plain user may name with auth on when the admin set nothing.
DEFAULT_FUNCTION_MODULES = ("workers.examples",)


@dataclass(frozen=True)
class SubmitPolicy:
    """`None` for `script_roots` / `function_modules`: anything on the hosts (the embedded
    single-user default); an empty tuple: nothing but shipped code."""

    kinds: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: {"user": KINDS, "admin": KINDS}
    )
    script_roots: tuple[Path, ...] | None = None
    function_modules: tuple[str, ...] | None = None

    def check(self, submit: JobSubmit, caller: Principal) -> None:
        entrypoint = submit.entrypoint
        role = "admin" if caller.is_admin else "user"
        if entrypoint.kind not in self.kinds.get(role, frozenset()):
            allowed = ", ".join(sorted(self.kinds.get(role, ()))) or "none"
            raise Forbidden(
                f"the {entrypoint.kind!r} entrypoint is not allowed for role {role} "
                f"(allowed: {allowed})",
                field="entrypoint.kind",
            )
        shipped = submit.package is not None
        if isinstance(entrypoint, Script):
            self._check_script(entrypoint.path, shipped)
        elif isinstance(entrypoint, Command) and not shipped and self.script_roots is not None:
            raise Forbidden(
                "a command runs only in a shipped working directory here: submit with "
                "--workdir (package)",
                field="package",
            )
        elif isinstance(entrypoint, Function) and not shipped:
            self._check_module(entrypoint.target)

    def _check_script(self, path: str, shipped: bool) -> None:
        if shipped:
            relative = PurePosixPath(path)
            if relative.is_absolute() or ".." in relative.parts:
                raise Forbidden(
                    "a script in a shipped working directory is a path inside it, "
                    "relative, without '..'",
                    field="entrypoint.path",
                )
            return
        if self.script_roots is None:
            return
        resolved = Path(path).resolve()
        if not any(resolved.is_relative_to(root.resolve()) for root in self.script_roots):
            roots = ", ".join(str(r) for r in self.script_roots) or "none: ship it with --workdir"
            raise Forbidden(
                f"scripts on the service's hosts must be under an allowed root ({roots})",
                field="entrypoint.path",
            )

    def _check_module(self, target: str) -> None:
        """The module named before the colon runs when imported, and the object the path
        after it reaches may be defined anywhere that module imports from: both must lie
        in the allowed modules. Where the object is defined is read from source
        (`defining_module`), never by importing it."""
        if self.function_modules is None:
            return
        module = target.partition(":")[0]
        if not self._allowed_module(module):
            raise Forbidden(
                f"module {module!r} is not among the allowed function modules "
                f"({self._allowed_list()})",
                field="entrypoint.target",
            )
        try:
            home = defining_module(target)
        except UnresolvedTarget as exc:
            raise Forbidden(
                f"cannot tell which module {target!r} is defined in: {exc}; only functions "
                f"defined in the allowed function modules ({self._allowed_list()}) may run",
                field="entrypoint.target",
            ) from exc
        except EntrypointError as exc:  # no such module or name: the same 422 as validation
            raise FieldError("entrypoint.target", str(exc)) from exc
        if not self._allowed_module(home):
            raise Forbidden(
                f"{target!r} is defined in module {home!r}, which is not among the allowed "
                f"function modules ({self._allowed_list()})",
                field="entrypoint.target",
            )

    def _allowed_module(self, module: str) -> bool:
        return any(
            module == prefix or module.startswith(prefix.rstrip(".") + ".")
            for prefix in self.function_modules or ()
        )

    def _allowed_list(self) -> str:
        return ", ".join(self.function_modules or ()) or "none: ship it with --workdir"


def policy_from_settings(
    *,
    auth_required: bool,
    kinds: Mapping[str, Sequence[str]],
    script_roots: list[Path] | None,
    function_modules: list[str] | None,
) -> SubmitPolicy:
    """Unset roots and modules mean: anything without auth, shipped code (and the bundled
    examples) with it."""
    default = SubmitPolicy()
    return SubmitPolicy(
        kinds={**default.kinds, **{role: frozenset(k) for role, k in kinds.items()}},
        script_roots=(
            tuple(script_roots) if script_roots is not None else (() if auth_required else None)
        ),
        function_modules=(
            tuple(function_modules)
            if function_modules is not None
            else (DEFAULT_FUNCTION_MODULES if auth_required else None)
        ),
    )
