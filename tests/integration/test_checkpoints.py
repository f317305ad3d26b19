"""Checkpoints are never overwritten in place, and listing them never fails (issue 15)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from api.app import create_app
from bench.harness.older_models import OlderGPT, WholeMLP, linears
from gangway.models import Builtin, JobSubmit
from scheduler.store import JobRepository, NewJob, make_engine, upgrade_to_head
from workers.checkpoint_layout import checkpoint_path, completed, listing, partial_path
from workers.engine import checkpoint as checkpoint_module
from workers.engine.checkpoint import Checkpointer
from workers.engine.gpt import GPT, Block
from workers.engine.model_configs import MODEL_CONFIGS


def checkpointer(directory: Path) -> Checkpointer:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    return Checkpointer(directory, [model], [torch.optim.AdamW(model.parameters())], keep_last=2)


def files_of(path: Path) -> dict[str, tuple[int, int]]:
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir()}


def test_a_save_at_a_step_that_has_a_checkpoint_keeps_it_untouched(tmp_path: Path) -> None:
    """A job stopped right after resuming saves again at the step it resumed from: the
    complete checkpoint there is kept as it is, not rewritten under its `.metadata`."""
    ranks = checkpointer(tmp_path)
    saved = ranks.save(120, sample=7)
    assert saved == checkpoint_path(tmp_path, 120)
    before = files_of(saved)
    with torch.no_grad():
        ranks.parts[0].weight.add_(1.0)  # state that would differ if it were written again
    assert ranks.save(120, sample=99) == saved
    assert files_of(saved) == before
    assert checkpointer(tmp_path).load_latest("sample") == 120


def test_a_kill_during_a_save_leaves_no_checkpoint_that_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranks = checkpointer(tmp_path)
    ranks.save(100)
    real_save = checkpoint_module.state_dict_saver.save

    def killed_after_writing(*args: Any, **kwargs: Any) -> Any:
        real_save(*args, **kwargs)  # every file written, `.metadata` too ...
        raise KeyboardInterrupt("killed")  # ... then the rank dies before the rename

    monkeypatch.setattr(checkpoint_module.state_dict_saver, "save", killed_after_writing)
    with pytest.raises(KeyboardInterrupt):
        ranks.save(200)
    assert (partial_path(tmp_path, 200) / ".metadata").exists()
    assert completed(tmp_path) == [checkpoint_path(tmp_path, 100)]
    assert checkpointer(tmp_path).load_latest() == 100  # the next attempt resumes from 100

    monkeypatch.setattr(checkpoint_module.state_dict_saver, "save", real_save)
    assert ranks.save(200) == checkpoint_path(tmp_path, 200)  # the retry replaces the partial
    assert not partial_path(tmp_path, 200).exists()
    assert [p.name for p in completed(tmp_path)] == ["step-00000100", "step-00000200"]


SPEC = JobSubmit(name="j", entrypoint=Builtin(steps=1)).model_dump(mode="json")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, int, Path]]:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade_to_head(url)
    repo = JobRepository(make_engine(url))
    job = repo.create(
        NewJob(name="j", queue="default", priority=0, spec=SPEC, num_gpus=1, total_steps=1)
    )
    root = tmp_path / "checkpoints"
    with TestClient(create_app(repo, checkpoint_root=root), raise_server_exceptions=False) as c:
        yield c, job.id, root / f"job-{job.id}"


def fake_checkpoint(directory: Path, name: str, *, complete: bool = True) -> Path:
    path = directory / name
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if complete:
        (path / ".metadata").write_bytes(b"m")
    return path


def test_junk_in_the_checkpoint_directory_is_ignored(api: tuple[TestClient, int, Path]) -> None:
    client, job_id, directory = api
    fake_checkpoint(directory, "step-00000010")
    fake_checkpoint(directory, "step-abc")  # junk with a .metadata
    fake_checkpoint(directory, "step-")
    fake_checkpoint(directory, ".partial-step-00000020")  # a save in progress
    (directory / "step-00000030").write_text("a file, not a directory")
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints")
    assert listed.status_code == 200
    assert [c["step"] for c in listed.json()["checkpoints"]] == [10]
    assert client.get(f"/ui/jobs/{job_id}/summary").status_code == 200


def test_listing_while_rank_0_prunes_never_fails(
    api: tuple[TestClient, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, job_id, directory = api
    # deterministic: a checkpoint removed between being found and being measured
    gone = fake_checkpoint(directory, "step-00000005")
    kept = fake_checkpoint(directory, "step-00000006")
    found = completed(directory)
    shutil.rmtree(gone)
    monkeypatch.setattr("workers.checkpoint_layout.completed", lambda _: found)
    assert [c.step for c in listing(directory)] == [6]
    monkeypatch.undo()
    shutil.rmtree(kept)

    # and for real: a pruner saving and deleting as fast as it can beside the listings
    stop = threading.Event()

    def prune_forever() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            path = fake_checkpoint(directory, f"step-{step:08d}")
            for extra in range(20):
                (path / f"__{extra}_0.distcp").write_bytes(b"y")
            old = directory / f"step-{step - 1:08d}"
            shutil.rmtree(old, ignore_errors=True)

    pruner = threading.Thread(target=prune_forever)
    pruner.start()
    try:
        for _ in range(100):
            assert client.get(f"/v1/jobs/{job_id}/checkpoints").status_code == 200
            assert client.get(f"/ui/jobs/{job_id}/summary").status_code == 200
    finally:
        stop.set()
        pruner.join()


@pytest.mark.parametrize("momentum_keys", ["position", "name"])
def test_a_checkpoint_with_whole_parameters_resumes_into_their_slices(
    tmp_path: Path, momentum_keys: str
) -> None:
    """A job checkpointed by an older release (head.weight and each MLP whole, DiLoCo's
    momentum keyed by parameter position or, later, by name) resumes: each head slice
    gets its rows of the weight, of AdamW's moments and of the outer momentum, each MLP
    slice its rows of fc and its columns of proj (proj's bias on slice 0), and the step;
    other parameters' outer momentum comes back under their names."""
    config = MODEL_CONFIGS["gpt-tiny"]
    torch.manual_seed(0)
    old = OlderGPT(GPT(config))
    old_optimizer = torch.optim.AdamW(old.parameters(), lr=1e-2)
    for param in old.parameters():
        param.grad = torch.randn_like(param)
    old_optimizer.step()
    old_keys = (
        [str(i) for i, _ in enumerate(old.parameters())]
        if momentum_keys == "position"
        else [n for n, _ in old.named_parameters()]
    )
    old_momentum = {
        f"outer_momentum.{k}": torch.randn_like(p)
        for k, p in zip(old_keys, old.parameters(), strict=True)
    }
    Checkpointer(tmp_path, [old], [old_optimizer], extra=old_momentum).save(3)

    torch.manual_seed(1)  # different weights, to be overwritten
    new = GPT(config)
    optimizer = torch.optim.AdamW(new.parameters(), lr=1e-2)
    for param in new.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()  # the optimizer's state exists, as in a running job
    momentum = {f"outer_momentum.{n}": torch.zeros_like(p) for n, p in new.named_parameters()}
    assert Checkpointer(tmp_path, [new], [optimizer], extra=momentum).load_latest() == 3

    def old_momentum_of(name: str) -> torch.Tensor:
        names = [n for n, _ in old.named_parameters()]
        return old_momentum[f"outer_momentum.{old_keys[names.index(name)]}"]

    slices = [piece.weight for piece in linears(new.head)]
    assert torch.equal(torch.cat(slices), old.head.weight)
    moments = torch.cat([optimizer.state[w]["exp_avg"] for w in slices])
    assert torch.equal(moments, old_optimizer.state[old.head.weight]["exp_avg"])
    assert all(float(optimizer.state[w]["step"]) == 1 for w in slices)
    assert torch.equal(new.ln_f.weight, old.ln_f.weight)  # type: ignore[union-attr]
    head_momentum = [momentum[f"outer_momentum.head.{c}.weight"] for c in range(len(slices))]
    assert torch.equal(torch.cat(head_momentum), old_momentum_of("head.weight"))
    mlp, old_mlp = cast(Block, new.blocks["1"]).mlp, cast(WholeMLP, old.blocks["1"].mlp)
    fc, proj = linears(mlp.fc), linears(mlp.proj)
    assert torch.equal(torch.cat([p.bias for p in fc]), old_mlp.fc.bias)
    assert torch.equal(torch.cat([p.weight for p in proj], dim=1), old_mlp.proj.weight)
    assert torch.equal(proj[0].bias, old_mlp.proj.bias)
    proj_moments = torch.cat([optimizer.state[p.weight]["exp_avg_sq"] for p in proj], dim=1)
    assert torch.equal(proj_moments, old_optimizer.state[old_mlp.proj.weight]["exp_avg_sq"])
    fc_momentum = [momentum[f"outer_momentum.blocks.1.mlp.fc.{c}.weight"] for c in range(4)]
    assert torch.equal(torch.cat(fc_momentum), old_momentum_of("blocks.1.mlp.fc.weight"))
    for name in ("tok_emb.weight", "ln_f.bias", "blocks.1.ln2.weight"):
        assert torch.equal(momentum[f"outer_momentum.{name}"], old_momentum_of(name))
