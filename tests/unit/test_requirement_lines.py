"""Which requirement lines pip gets from a job: a table of plain requirements and of the
options, URLs and paths pip would also take."""

from __future__ import annotations

import pytest

from gangway.requirement_lines import first_refused, requirement_problem


@pytest.mark.parametrize(
    "line",
    [
        "einops",
        "einops==0.8.0",
        "  einops==0.8.0  ",
        "requests[socks,security]>=2,<3",
        'tomli ; python_version < "3.11"',
        "numpy==1.*",
        "torch~=2.13",
        "my_project.sub-name>=1",
    ],
)
def test_plain_requirements_pass(line: str) -> None:
    assert requirement_problem(line) is None


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("-e /tmp", "pip option"),
        ("--editable=/tmp", "pip option"),
        ("-r /etc/x", "pip option"),
        ("  --index-url http://evil", "pip option"),
        ("--extra-index-url=http://evil", "pip option"),
        ("--trusted-host evil", "pip option"),
        ("-f /tmp/wheels", "pip option"),
        ("pkg @ file:///etc", "direct reference"),
        ("pkg[x] @ https://evil/pkg.tar.gz ; os_name == 'posix'", "direct reference"),
        ("git+https://evil/repo.git", "not a requirement"),
        ("https://evil/pkg-1.0.tar.gz", "not a requirement"),
        ("./localdir", "not a requirement"),
        ("/abs/path", "not a requirement"),
        ("../up", "not a requirement"),
        ("localdir/", "not a requirement"),
        ("numpy==1.26 --hash=sha256:00", "not a requirement"),
        ("numpy  # a comment", "not a requirement"),
        ("pkg-1.0-py3-none-any.whl", "file name"),
        ("pkg-1.0.tar.gz", "file name"),
        ("PKG.ZIP", "file name"),
        ("einops\n-e /tmp", "line break"),
        ("einops\r--index-url http://evil", "line break"),
    ],
)
def test_options_urls_and_paths_are_refused(line: str, why: str) -> None:
    problem = requirement_problem(line)
    assert problem is not None and why in problem


def test_the_first_refused_line_is_named_by_its_index() -> None:
    assert first_refused(["einops", "numpy==2", "-e .", "--index-url x"]) == (
        2,
        requirement_problem("-e ."),
    )
    assert first_refused(["einops"]) is None
    assert first_refused([]) is None
