"""`defining_module`: where a function target's object is defined, read from source with
`ast` only. A table of small packages written to disk; nothing in them is ever imported
(each module would leave a marker file if it were)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.program.entrypoints import (
    EntrypointError,
    UnresolvedTarget,
    check_function_target,
    defining_module,
)

MODULES = {
    "__init__.py": "",
    "helpers.py": (
        "def helper(ctx):\n    pass\nclass Base:\n    def inherited(self):\n        pass\n"
    ),
    "sub/__init__.py": (
        "from .deep import deep_fn\n"
        "try:\n"
        "    from .deep import maybe_fn\n"
        "except ImportError:\n"
        "    pass\n"
    ),
    "sub/deep.py": "def deep_fn(ctx):\n    pass\n",
    "sub/relative.py": "from ..helpers import helper as up\nfrom . import deep\n",
    "stars.py": "from math import *\nfrom .helpers import *\n",
    "stars_last.py": "from .helpers import *\nfrom math import *\n",
    "via.py": "from . import stars, stars_last\n",
    "tools.py": (
        "import subprocess\n"
        "import os.path\n"
        "import json as serial\n"
        "from os import system as run\n"
        "from .helpers import helper, Base\n"
        "from . import sub\n"
        "launch = subprocess.Popen\n"
        "printer = print\n"
        "made = dict(a=1)\n"
        "count: int = 3\n"
        "def local(ctx):\n"
        "    pass\n"
        "class Trainer:\n"
        "    step = staticmethod(local)\n"
        "    save = subprocess.run\n"
        "    def fit(self, ctx):\n"
        "        pass\n"
        "    class Inner:\n"
        "        def go(self):\n"
        "            pass\n"
        "class Child(Base):\n"
        "    pass\n"
        "try:\n"
        "    import tomllib as maybe\n"
        "except ImportError:\n"
        "    maybe = None\n"
        "def later(ctx):\n"
        "    pass\n"
        "later = subprocess.call\n"
    ),
}


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"resolve_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    for relative, source in MODULES.items():
        path = tmp_path / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"open({str(marker)!r}, 'w')\n{source}")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name
    assert not marker.exists(), "resolving a target imported the module"


@pytest.mark.parametrize(
    ("attribute", "home"),
    [
        ("local", "{p}.tools"),
        ("made", "{p}.tools"),  # a value the module made itself
        ("count", "{p}.tools"),
        ("Trainer", "{p}.tools"),
        ("Trainer.fit", "{p}.tools"),
        ("Trainer.step", "{p}.tools"),
        ("Trainer.Inner.go", "{p}.tools"),
        ("Trainer.save", "subprocess"),  # a class attribute aliasing another module's
        ("helper", "{p}.helpers"),
        ("Base.inherited", "{p}.helpers"),
        ("sub.deep_fn", "{p}.sub.deep"),
        ("sub.relative.up", "{p}.helpers"),
        ("sub.relative.deep.deep_fn", "{p}.sub.deep"),
        ("subprocess.run", "subprocess"),
        ("os.path.join", "os"),  # os has no Python source here (frozen): it ends the walk
        ("serial.dumps", "json"),
        ("run", "os"),
        ("launch", "subprocess"),
        ("printer", "builtins"),
        ("later", "subprocess"),  # the last top-level binding wins
    ],
)
def test_a_target_is_followed_to_where_it_is_defined(
    package: str, attribute: str, home: str
) -> None:
    assert defining_module(f"{package}.tools:{attribute}") == home.format(p=package)


def test_star_imports_are_followed_into_source_and_refused_from_compiled_code(
    package: str,
) -> None:
    assert defining_module(f"{package}.via:stars.helper") == f"{package}.helpers"
    with pytest.raises(UnresolvedTarget, match="star import of compiled module 'math'"):
        defining_module(f"{package}.via:stars.sqrt")
    with pytest.raises(UnresolvedTarget, match="compiled module 'math'"):  # it may rebind it
        defining_module(f"{package}.via:stars_last.helper")


@pytest.mark.parametrize(
    ("attribute", "why"),
    [
        ("Child.inherited", "not defined in the body of class 'Child'"),
        ("made.get", "'made' in module .* is not a class"),
        ("local.__globals__", "is not a class"),
        ("sub.maybe_fn", "only conditionally or not at all"),
        ("Trainer.missing", "not defined in the body of class 'Trainer'"),
    ],
)
def test_what_source_cannot_tell_is_unresolved(package: str, attribute: str, why: str) -> None:
    with pytest.raises(UnresolvedTarget, match=why):
        defining_module(f"{package}.tools:{attribute}")


def test_the_named_module_gives_the_same_errors_as_check_function_target(
    package: str,
) -> None:
    for target in (f"{package}.tools:nothing", f"{package}.absent:fn", "no_colon"):
        with pytest.raises(EntrypointError) as checked:
            check_function_target(target)
        with pytest.raises(EntrypointError) as resolved:
            defining_module(target)
        assert str(resolved.value) == str(checked.value)
        assert not isinstance(resolved.value, UnresolvedTarget)


def test_a_compiled_named_module_is_its_own_home() -> None:
    assert defining_module("math:sqrt") == "math"


def test_a_chain_of_imports_longer_than_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"chain_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    links = 12
    for i in range(links):
        (tmp_path / name / f"m{i}.py").write_text(f"from .m{i + 1} import fn\n")
    (tmp_path / name / f"m{links}.py").write_text("def fn(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert defining_module(f"{name}.m{links - 3}:fn") == f"{name}.m{links}"
    with pytest.raises(UnresolvedTarget, match="imports deep"):
        defining_module(f"{name}.m0:fn")


def test_a_cycle_of_imports_ends_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"cycle_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "a.py").write_text("from .b import fn\n")
    (tmp_path / name / "b.py").write_text("from .a import fn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(UnresolvedTarget, match="imports deep"):
        defining_module(f"{name}.a:fn")


def test_a_loaded_module_without_a_spec_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """`__main__` of a console script (`gangway serve`) has no spec: a 422, not a crash."""
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    for check in (check_function_target, defining_module):
        with pytest.raises(EntrypointError, match="cannot find module '__main__'"):
            check("__main__:main")


@given(
    st.text(alphabet="abjsonos._:", max_size=24)
    | st.sampled_from(["json:dumps", "os:path.join", "workers.examples:torch.nn.Module"])
)
def test_any_target_resolves_or_is_refused_never_crashes(target: str) -> None:
    with contextlib.suppress(EntrypointError):
        assert isinstance(defining_module(target), str)
