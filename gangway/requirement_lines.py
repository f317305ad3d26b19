"""Which requirement lines a job may hand to pip: plain `name[extras] specifier ; marker`.

Ray writes a job's requirement lines into a requirements file and runs pip on it on every
node, so a line is whatever pip reads in such a file: an option (`-e /path`, `-r file`,
`--index-url URL`), a URL, a local path or archive, each a way to install code from
wherever the submitter points, past the service's policy. A plain requirement installs a
named project from the node's configured index, which is what a job needs. Shared by the
service (which refuses the rest unless its admin allows them) and the CLI (which refuses
before uploading a working directory).
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.requirements import InvalidRequirement, Requirement

FORM = "'name[extras] specifier ; marker' (e.g. 'einops==0.8.0')"
# What pip takes as a local archive when a "name" ends so (pip's own list).
ARCHIVE_SUFFIXES = (
    ".zip",
    ".whl",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
)


def requirement_problem(line: str) -> str | None:
    """Why `line` is not a plain requirement, in a user's words; None when it is one."""
    text = line.strip()
    if any(ch in text for ch in "\r\n"):
        return "a line break would make one line two in pip's requirements file"
    if text.startswith("-"):
        return f"a pip option; only requirements are taken, of the form {FORM}"
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        why = str(exc).splitlines()[0]
        return f"not a requirement of the form {FORM}, such as a URL or a path ({why})"
    if requirement.url is not None:
        return "a direct reference ('name @ URL') installs from wherever the URL points"
    if requirement.name.lower().endswith(ARCHIVE_SUFFIXES):
        return "a file name: pip would install it as a local archive, not a named project"
    return None


def first_refused(lines: Sequence[str]) -> tuple[int, str] | None:
    """(index, why) of the first line that is not a plain requirement, or None."""
    for index, line in enumerate(lines):
        problem = requirement_problem(line)
        if problem is not None:
            return index, problem
    return None
