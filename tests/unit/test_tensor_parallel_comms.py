"""Tensor parallel's collectives, counted on a fake two-rank group (no processes, no
communication): the MLP's four slices still cost one collective each way, as one fc and
one proj did: their row-wise products stay partial sums until the MLP returns, and their
input gradients until they reach the MLP's one input DTensor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from workers.engine.gpt import GPT
from workers.engine.model_configs import MODEL_CONFIGS
from workers.engine.parallelize import apply_tensor_parallel

CONFIG = MODEL_CONFIGS["gpt-tiny"]
LAYERS = CONFIG.n_layer


@pytest.fixture
def fake_group() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield
    dist.destroy_process_group()


# CommDebugMode's module tracker hooks the model's backward; the embeddings' input (token
# ids) needs no gradient, which torch warns about.
@pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")
@pytest.mark.usefixtures("fake_group")
@pytest.mark.parametrize(
    ("sequence_parallel", "expected", "expected_backward"),
    [
        # one all-reduce after the attention, one after the MLP; backward, one per q, k, v
        # (three modules) and one for the MLP's input
        (False, {"all_reduce": 2 * LAYERS}, {"all_reduce": 4 * LAYERS}),
        # each becomes a reduce-scatter, then an all-gather before the next block's
        # column-wise layers, and one at the end to hand the head the full sequence
        (
            True,
            {"reduce_scatter_tensor": 2 * LAYERS, "all_gather_into_tensor": 2 * LAYERS + 1},
            {
                "all_gather_into_tensor": 2 * LAYERS + 1,
                "all_reduce": 3 * LAYERS,
                "reduce_scatter_tensor": LAYERS,
            },
        ),
    ],
)
def test_a_block_costs_two_collectives_whatever_the_mlp_slices(
    sequence_parallel: bool, expected: dict[str, int], expected_backward: dict[str, int]
) -> None:
    model = GPT(CONFIG)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    apply_tensor_parallel(model, mesh["tp"], sequence_parallel=sequence_parallel)
    tokens = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    with CommDebugMode() as forward:
        logits = model(tokens)
    with CommDebugMode() as backward:
        logits.sum().backward()
    assert counts(forward) == expected
    # the gradients: one all-reduce per column-wise input (q, k, v share theirs as one
    # tensor but are three modules; the MLP's four slices take one DTensor)
    assert counts(backward) == expected_backward


def counts(mode: CommDebugMode) -> dict[str, int]:
    return {str(op).rsplit(".", 1)[-1]: n for op, n in mode.get_comm_counts().items()}
