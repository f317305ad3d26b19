"""A rank whose program aborts at exit with torch's gloo teardown race is told what it met
and how to avoid it; no other ending gets the hint."""

import signal

from workers.supervisor.actor import describe_exit, exit_race_hint

RACE_TAIL = (
    "Finished running basic DDP example on rank 1.\nterminate called without an active exception"
)


def test_an_abort_at_exit_after_the_work_names_the_gloo_race() -> None:
    sandboxed = 128 + signal.SIGABRT  # bubblewrap reports a signal as 128 + N
    for code, in_sandbox in ((sandboxed, True), (-signal.SIGABRT, False)):
        hint = exit_race_hint(code, in_sandbox, RACE_TAIL)
        assert "gloo teardown race" in hint
        assert "destroy_process_group" in hint
    assert describe_exit(sandboxed, True) == "was killed by SIGABRT (exit code 134)"


def test_other_endings_get_no_hint() -> None:
    assert exit_race_hint(1, True, RACE_TAIL) == ""  # an ordinary failure
    assert exit_race_hint(128 + signal.SIGKILL, True, RACE_TAIL) == ""
    assert exit_race_hint(128 + signal.SIGABRT, True, "Aborted (core dumped)") == ""
    assert exit_race_hint(134, False, RACE_TAIL) == ""  # unsandboxed 134 is an exit code
