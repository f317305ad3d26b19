"""Tensor parallel's collectives, counted on a fake two-rank group (no processes, no
communication): the MLP's four slices still cost one all-reduce, as one fc and one proj
did, because their row-wise products stay partial sums until the MLP returns."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from workers.gpt import GPT
from workers.model_configs import MODEL_CONFIGS
from workers.parallelize import apply_tensor_parallel

CONFIG = MODEL_CONFIGS["gpt-tiny"]


@pytest.fixture
def fake_group() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("fake_group")
@pytest.mark.parametrize(
    ("sequence_parallel", "expected"),
    [
        # one all-reduce after the attention, one after the MLP
        (False, {"all_reduce": 2 * CONFIG.n_layer}),
        # each becomes a reduce-scatter, then an all-gather before the next block's
        # column-wise layers, and one at the end to hand the head the full sequence
        (
            True,
            {
                "reduce_scatter_tensor": 2 * CONFIG.n_layer,
                "all_gather_into_tensor": 2 * CONFIG.n_layer + 1,
            },
        ),
    ],
)
def test_a_block_costs_two_collectives_whatever_the_mlp_slices(
    sequence_parallel: bool, expected: dict[str, int]
) -> None:
    model = GPT(CONFIG)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    apply_tensor_parallel(model, mesh["tp"], sequence_parallel=sequence_parallel)
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    with CommDebugMode() as comms:
        model(tokens)
    counts = {str(op).rsplit(".", 1)[-1]: n for op, n in comms.get_comm_counts().items()}
    assert counts == expected
