"""What the step-time model needs to know of a job and a node: the job's model and plan
(built-in trainer jobs only) and the node's type. Shared by the loop's predictions and
`POST /v1/estimate`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from gangway.models import Builtin
from scheduler.model import BuiltinEntrypoint, JobSpec, Node
from scheduler.predict.steptime import ModelShape, NodeType, StepPlan
from workers.engine.model_configs import MODEL_CONFIGS

# Memory of one device, for plans that must fit (`auto`); H100/H200-class by default.
DEVICE_MEMORY_BYTES = 80 * 2**30


@dataclass(frozen=True, slots=True)
class TrainerJob:
    """A built-in trainer job as the step-time model sees it."""

    model: ModelShape
    plan: StepPlan
    steps: int


def trainer_job(spec: JobSpec, dp: int | None = None) -> TrainerJob | None:
    """The job's model and plan at data-parallel degree `dp` (default: its largest);
    None for opaque jobs and unknown model names."""
    entry = spec.entrypoint
    if not isinstance(entry, BuiltinEntrypoint):
        return None
    settings = Builtin.model_validate({**entry.settings, "kind": "builtin"})
    config = MODEL_CONFIGS.get(settings.model)
    if config is None:
        return None
    mesh = spec.shape.parallelism
    plan = StepPlan(
        dp=dp or mesh.dp,
        tp=mesh.tp,
        pp=mesh.pp,
        fsdp=spec.fsdp,
        microbatches=settings.microbatches,
        schedule=settings.pipeline_schedule,
        precision=settings.precision,
        batch_size=settings.batch_size,
        grad_accumulation=settings.grad_accumulation,
    )
    return TrainerJob(ModelShape(**asdict(config)), plan, settings.steps)


# One workload every type's speed is compared on: gpt-small, one rank, a batch of 8; big
# enough that compute, not the per-step constant, sets its step time on a GPU.
REFERENCE_MODEL = ModelShape(**asdict(MODEL_CONFIGS["gpt-small"]))
REFERENCE_PLAN = StepPlan(batch_size=8)


def node_type(node: Node, memory_bytes: float = DEVICE_MEMORY_BYTES) -> NodeType:
    """Nodes of one shape are one type: a GPU node runs a rank per GPU, a CPU node as
    many ranks at once as it has cores."""
    cpus = max(1, int(node.num_cpus))
    if node.num_gpus:
        gpus = f"{node.num_gpus} {node.gpu_type}" if node.gpu_type else f"{node.num_gpus} GPU"
        name = f"{gpus} / {cpus} CPU"
        return NodeType(name, node.num_gpus, node.num_gpus, memory_bytes, gpu_type=node.gpu_type)
    return NodeType(f"{cpus} CPU", cpus, cpus, memory_bytes, gpu=False)


def gpu_node_types(nodes: Iterable[Node]) -> list[NodeType]:
    """The node types of the live GPU nodes, most common first (ties by name)."""
    counts = Counter(node_type(n) for n in nodes if n.alive and n.num_gpus)
    return sorted(counts, key=lambda kind: (-counts[kind], kind.name))


def common_node_type(nodes: Iterable[Node]) -> NodeType | None:
    """The type most of the live GPU nodes have: where a job not yet placed will likely
    run (every rank needs a GPU; a cluster of CPU nodes only: theirs)."""
    live = [n for n in nodes if n.alive]
    counts = Counter(node_type(n) for n in live if n.num_gpus) or Counter(map(node_type, live))
    return counts.most_common(1)[0][0] if counts else None
