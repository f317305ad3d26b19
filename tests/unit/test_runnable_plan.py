"""`parallelism: auto` offers only plans the engine's own check accepts."""

from __future__ import annotations

from api.validation import runnable_plan
from gangway.models import Builtin
from scheduler.predict.steptime import StepPlan


def test_a_candidate_is_runnable_only_if_the_submit_check_would_take_it() -> None:
    one_f_one_b = Builtin(model="gpt-tiny")
    assert not runnable_plan(one_f_one_b, StepPlan(pp=2, microbatches=1, batch_size=8))
    assert runnable_plan(one_f_one_b, StepPlan(pp=2, microbatches=2, batch_size=8))
    zbv = Builtin(model="gpt-tiny", pipeline_schedule="zbv")
    assert runnable_plan(zbv, StepPlan(dp=2, pp=2, microbatches=1, batch_size=8))
    assert runnable_plan(zbv, StepPlan(dp=2, pp=2, fsdp=True, microbatches=2, batch_size=8))
    assert not runnable_plan(zbv, StepPlan(pp=4, microbatches=4, batch_size=8))  # 8 stages
