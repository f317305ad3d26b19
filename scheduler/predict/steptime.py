"""Step time of the built-in trainer from the work per step, calibrated per node type.

A step's time on a plan is modelled as a few physical terms, each the work the plan
does per rank times a coefficient fitted from this cluster's measured runs:

    step_s = a * compute  +  b * bytes  +  c * messages  +  d

- compute: FLOPs per rank per step (6 x params x tokens + attention, split over tp x pp),
  stretched by the pipeline bubble ((pp - 1) / (microbatches x virtual stages) idle) and
  by ranks sharing a node's processors (`NodeType.parallel_ranks`);
- bytes: what one rank sends per step: data-parallel gradient all-reduce (DDP) or
  all-gather + reduce-scatter (FSDP), tensor-parallel activation all-reduces (4 per
  layer), pipeline activations across each stage boundary;
- messages: collectives and sends per step (their latency);
- d: fixed cost per step (optimizer step, Python).

Coefficients are fitted per (node type, precision) by non-negative least squares on
relative error (`calibrate`); between measured plans and sizes the terms interpolate.
Whole-job time is steps x step time + start-up; `refine` blends in observed steps.

Before any run of a node type was measured, `assumed` gives the same terms coefficients
from assumed speeds (peak FLOP/s per rank, link bytes/s, latency, per-step overhead):
good enough to rank plans against each other (`auto`), not to promise a run time, so its
expected error is unknown. A fitted calibration's expected error is its median relative
error on the runs it was fitted to.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gangway.models import TWO_CHUNK_SCHEDULES

FEATURES = ("compute_flop", "comm_bytes", "messages", "constant")
BYTES = {"fp32": 4, "bf16": 2}
# fp32 weights + grads + Adam's two moments: 16 bytes per parameter.
STATE_BYTES_PER_PARAM = 16
# Assumed speeds per rank until a node type's runs are measured: a GPU of today's data
# centre class (a fraction of its bf16 peak, as trainers reach), a CPU core otherwise.
ASSUMED_GPU = (2e14, 1e11, 2e-5, 0.02)  # FLOP/s, bytes/s, s per message, s per step
ASSUMED_CPU = (2e10, 2e9, 1e-4, 0.02)
# The least error a fit claims: one to no more runs than it has terms matches them
# exactly, so its misses on them say nothing (FEW_RUNS_ERROR); each run beyond the
# terms earns trust, down to MIN_EXPECTED_ERROR.
FEW_RUNS_ERROR = 0.20
MIN_EXPECTED_ERROR = 0.05


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A GPT-style decoder's size (the built-in trainer's `GPTConfig` fields)."""

    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    n_embd: int

    @property
    def params(self) -> int:
        """Parameters as nanoGPT counts them, with a tied head: 12 d^2 per block plus the
        embeddings. The built-in model's head is untied, so its vocab x d weights are left
        out here (the held-out accuracy in BENCHMARKS.md was measured with this count)."""
        d = self.n_embd
        return self.n_layer * 12 * d * d + self.vocab_size * d + self.seq_len * d


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One job's plan: parallel degrees and the per-rank batch (sequences per micro-step)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    fsdp: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"
    precision: str = "fp32"
    batch_size: int = 2
    grad_accumulation: int = 1

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True, slots=True)
class NodeType:
    """Where ranks run. `parallel_ranks`: how many ranks of a node make progress at once
    (a GPU each: devices_per_node; ranks sharing CPU cores: the cores)."""

    name: str
    devices_per_node: int
    parallel_ranks: int
    memory_bytes: float
    startup_s: float = 30.0
    gpu: bool = True  # its ranks run on GPUs (else CPU cores)
    gpu_type: str | None = None  # its GPUs' type, where the node names it


def work(model: ModelShape, plan: StepPlan, node: NodeType) -> np.ndarray:
    """The plan's per-rank work per step, in the order of FEATURES."""
    tokens = plan.batch_size * plan.grad_accumulation * model.seq_len  # per dp rank
    attention = 12 * model.n_layer * model.n_embd * model.seq_len  # per token, fwd+bwd
    flops = (6 * model.params + attention) * tokens / (plan.tp * plan.pp)
    virtual = 2 if plan.schedule in TWO_CHUNK_SCHEDULES and plan.pp > 1 else 1
    bubble = 1 + (plan.pp - 1) / (plan.microbatches * virtual)
    sharing = max(1.0, min(plan.world, node.devices_per_node) / node.parallel_ranks)
    compute = flops * bubble * sharing
    size = BYTES.get(plan.precision, 4)
    shard = model.params * 4 / (plan.tp * plan.pp)  # gradients stay fp32
    ring = (plan.dp - 1) / plan.dp
    dp_bytes = (3 if plan.fsdp else 2) * ring * shard
    activation = plan.batch_size * model.seq_len * model.n_embd * size
    layers = model.n_layer / plan.pp
    tp_bytes = 4 * layers * 2 * (plan.tp - 1) / plan.tp * activation * plan.grad_accumulation
    pp_bytes = 2 * activation * plan.grad_accumulation if plan.pp > 1 else 0.0
    messages = (
        (3 * layers if plan.fsdp else 1) * (plan.dp > 1)
        + 4 * layers * (plan.tp > 1) * plan.grad_accumulation
        + 2 * plan.microbatches * virtual * (plan.pp > 1) * plan.grad_accumulation
    )
    # A blocking collective completes once every peer runs: ranks sharing cores wait
    # their turn at each one, so a message's latency grows with the sharing too.
    return np.array([compute, dp_bytes + tp_bytes + pp_bytes, messages * sharing, 1.0])


@dataclass(frozen=True, slots=True)
class Calibration:
    """Coefficients (seconds per unit of each FEATURES term) for one node type: fitted
    to `runs` measured runs, or assumed (runs 0). `expected_error`: the median relative
    error on the runs fitted to (None: assumed, unknown)."""

    node: NodeType
    coefficients: tuple[float, ...]
    runs: int
    expected_error: float | None = None

    def describe(self) -> str:
        if not self.runs:
            return (
                f"assumed speeds for {self.node.name} (not measured: error unknown; "
                "`gangway calibrate` measures it)"
            )
        error = self.expected_error or 0.0
        return (
            f"step-time model for {self.node.name} ({self.runs} recorded runs, "
            f"expected error {error:.0%})"
        )

    def step_time_s(self, model: ModelShape, plan: StepPlan) -> float:
        return float(np.dot(self.coefficients, work(model, plan, self.node)))


@dataclass(frozen=True, slots=True)
class Measured:
    model: ModelShape
    plan: StepPlan
    step_time_s: float
    startup_s: float | None = None  # the run's time besides its steps, when known


def calibrate(node: NodeType, runs: Sequence[Measured]) -> Calibration:
    """Non-negative least squares on relative error: each run's row is scaled by 1 / its
    measured time, so a 10% miss costs the same on a short step as on a long one. A term
    that would get a negative coefficient is dropped and the rest refitted. The node's
    start-up becomes the median the runs measured, where they did."""
    if not runs:
        raise ValueError("calibration needs at least one measured run")
    rows = np.array([work(r.model, r.plan, node) for r in runs])
    times = np.array([r.step_time_s for r in runs])
    scaled = rows / times[:, None]
    active = list(range(len(FEATURES)))
    while True:
        columns = scaled[:, active] / _scale(rows[:, active])
        solution, *_ = np.linalg.lstsq(columns, np.ones(len(runs)), rcond=None)
        solution = solution / _scale(rows[:, active])
        if (solution >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(solution)))
    coefficients = np.zeros(len(FEATURES))
    coefficients[active] = np.maximum(solution, 0.0)
    # A term no run exercised (all dp=1 on one-device nodes: no bytes sent) is not free:
    # it keeps its assumed price, or the fit would call every collective costless.
    unmeasured = ~rows.any(axis=0)
    coefficients[unmeasured] = np.array(assumed(node).coefficients)[unmeasured]
    predicted = rows @ coefficients
    error = float(np.median(np.abs(predicted - times) / times))
    floor = error_floor(len(runs))
    startups = [r.startup_s for r in runs if r.startup_s is not None]
    if startups:
        node = replace(node, startup_s=float(np.median(startups)))
    return Calibration(node, tuple(coefficients.tolist()), len(runs), max(error, floor))


def assumed(node: NodeType) -> Calibration:
    """The step-time terms priced at assumed speeds (`ASSUMED_GPU` / `ASSUMED_CPU`)."""
    flops, link, latency, overhead = ASSUMED_GPU if node.gpu else ASSUMED_CPU
    return Calibration(node, (1 / flops, 1 / link, latency, overhead), runs=0)


def error_floor(runs: int) -> float:
    """The least expected error a fit to `runs` runs claims (see FEW_RUNS_ERROR)."""
    beyond = max(1, runs - len(FEATURES) + 1)
    return max(MIN_EXPECTED_ERROR, FEW_RUNS_ERROR / beyond)


def _scale(columns: np.ndarray) -> np.ndarray:
    """Column magnitudes, so lstsq sees numbers of one size (FLOPs ~1e12, messages ~10)."""
    top = np.abs(columns).max(axis=0)
    return np.where(top > 0, top, 1.0)


def job_time_s(calibration: Calibration, model: ModelShape, plan: StepPlan, steps: int) -> float:
    """Whole job on a fresh start: start-up plus steps x predicted step time."""
    return calibration.node.startup_s + steps * calibration.step_time_s(model, plan)


def refine(
    predicted_step_s: float, observed_step_s: Sequence[float], prior_weight: int = 5
) -> float:
    """Step time once steps have been observed: the prediction counts as `prior_weight`
    observations, the median of the observed ones (robust to a slow first step) as many
    as were seen."""
    if not observed_step_s:
        return predicted_step_s
    seen = len(observed_step_s)
    median = float(np.median(observed_step_s))
    return (prior_weight * predicted_step_s + seen * median) / (prior_weight + seen)


def memory_bytes(model: ModelShape, plan: StepPlan) -> float:
    """Per-rank memory: model state split over tp x pp (and dp under FSDP), plus the
    activations of the microbatches in flight (about 34 x b x s x d bytes per layer in
    half precision, as Korthikanti et al. count; doubled for fp32)."""
    state = STATE_BYTES_PER_PARAM * model.params / (plan.tp * plan.pp)
    if plan.fsdp:
        state /= plan.dp
    micro_batch = plan.batch_size / (plan.microbatches if plan.pp > 1 else 1)
    per_layer = 34 * micro_batch * model.seq_len * model.n_embd / plan.tp
    per_layer *= BYTES.get(plan.precision, 4) / 2
    in_flight = min(plan.pp, plan.microbatches) if plan.pp > 1 else 1
    return state + per_layer * (model.n_layer / plan.pp) * in_flight


@dataclass(frozen=True, slots=True)
class Choice:
    plan: StepPlan
    step_time_s: float
    job_time_s: float
    reason: str


def auto_plan(
    calibration: Calibration,
    model: ModelShape,
    *,
    gpus: int,
    global_batch: int,
    steps: int,
    precision: str = "fp32",
    schedule: str = "1f1b",
    runnable: Callable[[StepPlan], bool] = lambda plan: True,
) -> Choice | None:
    """For a budget of `gpus`, the plan that finishes soonest and fits the node's memory,
    keeping the global batch (dp x batch x grad_accumulation) fixed; None if none fits.
    Candidates: every dp x tp x pp <= gpus with tp dividing the heads and within a node,
    pp dividing the layers, FSDP on or off, 1..8 microbatches, under the job's pipeline
    `schedule`; of those, only the ones `runnable` accepts (the engine's own plan check,
    so the pick is never a plan the submit check would refuse)."""
    node = calibration.node
    best: Choice | None = None
    considered = fitting = 0
    like = StepPlan(precision=precision, schedule=schedule)
    for plan in _candidates(model, node, gpus, global_batch, like):
        if not runnable(plan):
            continue
        considered += 1
        if memory_bytes(model, plan) > node.memory_bytes:
            continue
        fitting += 1
        step_s = calibration.step_time_s(model, plan)
        total = job_time_s(calibration, model, plan, steps)
        if best is None or (total, plan.world, _tie(plan)) < (
            best.job_time_s,
            best.plan.world,
            _tie(best.plan),
        ):
            best = Choice(plan, step_s, total, "")
    if best is None:
        return None
    p = best.plan
    reason = (
        f"dp={p.dp} tp={p.tp} pp={p.pp}{' fsdp' if p.fsdp else ''} microbatches={p.microbatches}: "
        f"predicted {best.step_time_s:.3f} s/step, {best.job_time_s:.0f} s for {steps} steps, "
        f"{memory_bytes(model, p) / 2**30:.2f} GiB/rank of {node.memory_bytes / 2**30:.0f}; "
        f"the fastest of {fitting} plans that fit memory ({considered} considered) on "
        f"{node.name}, by the {calibration.describe()}"
    )
    return Choice(best.plan, best.step_time_s, best.job_time_s, reason)


def _tie(plan: StepPlan) -> tuple[int, int, int, bool, int]:
    return (plan.tp, plan.pp, plan.dp, plan.fsdp, plan.microbatches)


def _candidates(
    model: ModelShape, node: NodeType, gpus: int, global_batch: int, like: StepPlan
) -> Iterable[StepPlan]:
    """Plans of every shape, with `like`'s precision and schedule."""
    for world in range(1, gpus + 1):
        for tp, pp in itertools.product(_divisors(world), repeat=2):
            if world % (tp * pp) or model.n_head % tp or tp > node.devices_per_node:
                continue
            if model.n_layer % pp:
                continue
            dp = world // (tp * pp)
            if global_batch % dp:
                continue
            per_dp = global_batch // dp
            for fsdp, micro in itertools.product((False, True), (1, 2, 4, 8)):
                if (fsdp and dp == 1) or (pp == 1 and micro > 1) or per_dp % micro:
                    continue
                accumulation = micro if pp == 1 else 1
                yield replace(
                    like,
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    fsdp=fsdp,
                    microbatches=micro if pp > 1 else 1,
                    batch_size=per_dp // accumulation,
                    grad_accumulation=accumulation,
                )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mdape(pairs: Iterable[tuple[float, float]]) -> float:
    """Median absolute percentage error of (predicted, measured) pairs."""
    errors = [abs(p - m) / m for p, m in pairs]
    return float(np.median(errors)) if errors else math.nan
