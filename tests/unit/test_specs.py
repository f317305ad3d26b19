"""The typed JobSpec: built from the stored body by one function, every default taken from
the wire model; a function target checked without importing user code."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gangway.models import Builtin, ElasticDP, JobSubmit, Parallelism, submit_body
from scheduler.model import BuiltinEntrypoint, FunctionEntrypoint, JobSpec
from scheduler.runtime.launch import LaunchPolicy, job_launch
from scheduler.store.specs import spec_from_json
from workers.checkpoint_store import CheckpointStore
from workers.launch import BuiltinRun
from workers.program.entrypoints import EntrypointError, check_function_target


def stored(submit: JobSubmit) -> JobSpec:
    return spec_from_json(submit.model_dump(mode="json"))


def test_a_submission_reads_back_typed_with_its_defaults() -> None:
    spec = stored(JobSubmit(name="j", entrypoint=Builtin(steps=7)))
    assert spec.shape.num_gpus == 1 and spec.max_restarts == 0 and spec.preemptible
    assert spec.checkpoint.keep_last == 2 and spec.time_limit_s is None
    assert isinstance(spec.entrypoint, BuiltinEntrypoint)
    assert spec.entrypoint.settings["steps"] == 7


def test_an_elastic_gang_is_described_at_its_largest_degree_until_placed() -> None:
    submit = JobSubmit(
        name="j", parallelism=Parallelism(dp=ElasticDP(min=2, max=8), tp=2), entrypoint=Builtin()
    )
    spec = stored(submit)
    assert (spec.shape.dp_min, spec.shape.dp_max, spec.shape.parallelism.dp) == (2, 8, 8)
    assert spec.placed(["n"] * 6).parallelism.dp == 3


def test_a_row_stored_before_a_field_existed_takes_the_wire_default() -> None:
    old = {"name": "j", "entrypoint": {"kind": "function", "target": "m:f"}}
    spec = spec_from_json(old)
    assert spec.entrypoint == FunctionEntrypoint(target="m:f", kwargs={})
    assert spec.checkpoint.keep_last == 2 and spec.time_limit_s is None


def test_secrets_are_stored_by_submit_body_only_and_read_back_for_the_ranks() -> None:
    submit = JobSubmit(name="j", entrypoint=Builtin(), env={"A": "1"}, secrets={"T": "s3"})
    assert "secrets" not in submit.model_dump(mode="json")  # no response can carry them
    spec = spec_from_json(submit_body(submit))
    assert (dict(spec.code.env), dict(spec.code.secrets)) == ({"A": "1"}, {"T": "s3"})
    assert "s3" not in repr(spec)
    assert stored(JobSubmit(name="j", entrypoint=Builtin())).code.secrets == {}
    assert "secrets" not in submit_body(JobSubmit(name="j", entrypoint=Builtin()))


def test_the_ranks_receive_the_trainer_settings_and_the_services_part() -> None:
    spec = stored(JobSubmit(name="j", entrypoint=Builtin(steps=9), env={"A": "1"}))
    policy = LaunchPolicy(checkpoint_root=Path("/ckpt"), outputs_root=Path("/out"))
    launch = job_launch(spec, job_id=5, attempt=2, user="alice", policy=policy)
    assert isinstance(launch.run, BuiltinRun)
    assert launch.run.fields["steps"] == 9 and launch.run.fields["fsdp"] is False
    assert launch.run.fields["keep_last"] == 2 and "kind" not in launch.run.fields
    assert launch.checkpoint_dir is not None and launch.checkpoint_dir.startswith("/ckpt")
    assert (launch.outputs_dir, launch.env, launch.user) == ("/out/job-5", {"A": "1"}, "alice")
    assert launch.input_dirs == {}
    reader = stored(JobSubmit(name="r", entrypoint=Builtin(), inputs_from=[3, 4]))
    launched = job_launch(reader, job_id=6, attempt=1, user="alice", policy=policy)
    assert launched.input_dirs == {"job-3": "/out/job-3", "job-4": "/out/job-4"}


def test_with_a_store_the_ranks_get_urls_not_directories() -> None:
    """The job's checkpoints and outputs, the upstream job's checkpoint (whose step the
    supervisors pick: the scheduling loop never waits on the store) and the outputs it
    reads."""
    store = CheckpointStore("memory://specs-launch/ckpt")
    policy = LaunchPolicy(
        checkpoint_root=Path("/ckpt"),
        checkpoint_url=store.url,
        outputs_root=Path("/out"),
        outputs_url="s3://bucket/out/",
        outputs_left=lambda user: 77,
    )
    newest = stored(
        JobSubmit(name="j", entrypoint=Builtin(), init_from={"job": 3}, inputs_from=[4])
    )
    launch = job_launch(newest, job_id=7, attempt=1, user="alice", policy=policy)
    assert (launch.checkpoint_dir, launch.checkpoint_url) == (None, store.job_url(7))
    assert (launch.outputs_dir, launch.outputs_url) == (None, "s3://bucket/out/job-7")
    assert launch.outputs_max_bytes == 77
    assert (launch.input_dirs, launch.input_urls) == ({}, {"job-4": "s3://bucket/out/job-4"})
    versioned = stored(
        JobSubmit(name="v", entrypoint=Builtin(), init_from={"model": "gpt", "version": 2})
    )
    on_store = replace(policy, models_root=Path("/models"), models_url="s3://bucket/models")
    started = job_launch(versioned, job_id=9, attempt=1, user="alice", policy=on_store)
    assert (started.model_dir, started.model_url) == (None, "s3://bucket/models/gpt/v2")
    assert (launch.model_dir, launch.model_checkpoints) == (None, store.job_url(3))
    assert launch.model_step is None
    named = stored(JobSubmit(name="j", entrypoint=Builtin(), init_from={"job": 3, "step": 9}))
    launch = job_launch(named, job_id=8, attempt=1, user="alice", policy=policy)
    assert (launch.model_checkpoints, launch.model_step) == (store.job_url(3), 9)


def test_a_function_target_is_checked_without_running_its_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('side effect')\n")
    (package / "train.py").write_text(
        f"open({str(marker)!r}, 'w').write('side effect')\ndef main(ctx):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    check_function_target("userpkg.train:main")
    with pytest.raises(EntrypointError, match="no attribute 'missing'"):
        check_function_target("userpkg.train:missing")
    with pytest.raises(EntrypointError, match="cannot find module"):
        check_function_target("userpkg.nothing:main")
    assert not marker.exists() and "userpkg" not in sys.modules


def test_a_malformed_target_names_the_expected_shape() -> None:
    with pytest.raises(EntrypointError, match=r"package\.module:function"):
        check_function_target("no_colon")
