"""PyTorch's "Getting Started with DDP" basic example, as a torchrun script.

From https://pytorch.org/tutorials/intermediate/ddp_tutorial.html (the `elastic_ddp.py`
variant meant for `torchrun --nnodes=... --nproc-per-node=...`), changed only to run on
CPU: the "gloo" backend instead of "nccl", and no `.to(device_id)`; and one addition: the
model is freed before `destroy_process_group`. On gloo, torch 2.13 aborts about one exit in
five otherwise ("terminate called without an active exception", under torchrun as under
Gangway: 8 of 40 runs here): a gloo worker thread drops the last reference to DDP's final
allreduce while the interpreter is already shutting down (pytorch/pytorch#179291). Freeing
the model (and collecting DDP's reference cycles) drops DDP's hold on the process group, so
`destroy_process_group` destroys it, joining those threads while the interpreter is still
alive (0 of 30).
Gangway runs it with `{"kind": "script", "path": "examples/ddp_tutorial.py"}`.
"""

import gc

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
    # create model and move it to GPU with id rank
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    del ddp_model, model, optimizer  # the addition: see the module's docstring
    gc.collect()
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    demo_basic()
