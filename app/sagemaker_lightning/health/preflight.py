"""Pre-flight: once every rank has joined, before the first step, the job checks that it can work and says how
fast its network is, in one line of rank 0's, e.g.

    pre-flight: 2 hosts × 1 process, cpu; all-reduce busbw 1.23 GB/s at 16 MiB (expected: unknown for local);
    p2p to 127.0.0.1 0.9 GB/s; devices ok (cpu: no check); EFA: not on this instance type; 0.8 s (preflight=off skips it)

  devices    a GPU host has the GPUs its instance type has (instances.py) and SM_NUM_GPUS says, and each rank's GPU
             multiplies a seeded matrix as the CPU does;
  EFA        (several hosts, where the type has EFA) its devices in /sys/class/infiniband, libfabric not pointed at
             another provider, NCCL not at sockets, the aws-ofi-nccl plugin on the loader's path (efa.py);
  bandwidth  (several ranks) an all-reduce at a few sizes, busbw as nccl-tests defines it, against a floor: the
             published figure for the type and host count (instances.py) or preflight_min_busbw; rank 0 exchanges a
             buffer with each other host's first rank, and a host much slower than the others is named.
A device or EFA problem ends the job unless preflight=off; a busbw below the floor warns (preflight=warn, the default)
or ends the job (preflight=fail). Every rank reaches the same verdict from the same gathered findings, so a failure
is the same one line on every host (failure.UserError) and no rank is left waiting in a collective. In a platform's
job only (plan.in_job). The verdict, from the findings to the line, is pure: preflight_verdict.py.

    python train.py --preflight fail --preflight_min_busbw 50     # as hyperparameters: {"preflight": "fail", ...}
"""

import os
import time
from collections.abc import Sequence
from typing import Literal

import torch

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.health import efa
from sagemaker_lightning.health.preflight_verdict import (
    FLOOR_FRACTION,
    Findings,
    Measured,
    MiB,
    busbw,
    device_problems,
    floor,
    size,
    summary,
    verdict,
)
from sagemaker_lightning.launch import instances
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares
from sagemaker_lightning.toolbox.lightning_package import made

CPU_SIZES = (1 * MiB, 16 * MiB)  # gloo over TCP: well under a second on 2 CPU cores, loopback
GPU_SIZES = (1 * MiB, 64 * MiB, instances.GiB)  # the table's figures are at 1 GiB, where busbw has levelled off
P2P_BYTES = {"cpu": 16 * MiB, "cuda": 256 * MiB}
WARMUP, ITERATIONS = 1, 3  # the first of each size sets up connections (NCCL's channels), the rest are timed
MODE = Setting(
    "preflight",
    Literal["warn", "fail", "off"],
    "warn",
    "checks before the first step (preflight.py): device and EFA problems fail; a busbw below the floor warns (warn) "
    "or fails (fail); off: none",
)
MIN_BUSBW = Setting(
    "preflight_min_busbw",
    float | None,
    None,
    f"all-reduce busbw floor in GB/s; null: {FLOOR_FRACTION * 100:.0f} percent of the published figure for the "
    "instance type and host count, where there is one (instances.py)",
)


def compute_problem(device: torch.device) -> str | None:
    """A seeded matrix product on `device` against the CPU's: a GPU that errs or computes wrong is named. Tolerances
    admit TF32 (torch.backends.cuda.matmul.allow_tf32, which a project may turn on)."""
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) / 16
    try:
        got = (a.to(device) @ a.to(device)).cpu()
    except RuntimeError as e:
        return f"a matrix product on {device} failed ({str(e).splitlines()[0]})"
    if not torch.allclose(got, a @ a, rtol=1e-2, atol=1e-3):
        return f"a matrix product on {device} differs from the CPU's by up to {(got - a @ a).abs().max():.3g}"
    return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_busbw(size_bytes: int, device: torch.device) -> float:
    """Every rank calls it: busbw of an all-reduce of `size_bytes`, as this rank timed it."""
    dist = torch.distributed
    tensor = torch.zeros(size_bytes // 4, device=device)
    for _ in range(WARMUP):
        dist.all_reduce(tensor)
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        dist.all_reduce(tensor)
    _synchronize(device)
    return busbw(size_bytes, (time.perf_counter() - start) / ITERATIONS, dist.get_world_size())


def exchange(peer: int, size_bytes: int, device: torch.device) -> float:
    """Rank 0 and `peer` call it: a buffer there and back, GB/s each way as rank 0 timed it (0 elsewhere)."""
    dist, rank = torch.distributed, torch.distributed.get_rank()
    buffer = torch.zeros(size_bytes // 4, device=device)

    def there_and_back():
        if rank == 0:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)

    there_and_back()  # NCCL connects the pair on its first transfer
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        there_and_back()
    _synchronize(device)
    return 2 * size_bytes * ITERATIONS / (time.perf_counter() - start) / 1e9


class Preflight:
    """Pre-flight (module docstring) in the trainer's setup for fit: Lightning has joined the ranks by then."""

    BASE = "callbacks.Callback"

    def __init__(self, plan, *, mode: str = "warn", min_busbw: float | None = None, root: str = "/"):
        self.plan, self.mode, self.min_busbw, self.root = plan, mode, min_busbw, root

    def setup(self, trainer, pl_module, stage):
        if stage != "fit" or self.mode == "off" or not self.plan.in_job:
            return
        start = time.perf_counter()
        dist, device = torch.distributed, trainer.strategy.root_device
        several = trainer.world_size > 1 and dist.is_available() and dist.is_initialized()
        findings = [self.local(trainer, device)]
        if several:  # first the local checks: a broken GPU or EFA stops every rank before any probe
            findings = [None] * trainer.world_size
            dist.all_gather_object(findings, self.local(trainer, device))
        failed, _ = verdict(findings, None, None, self.mode)
        if failed:
            raise UserError(failed)
        measured = None
        if several:
            shared = [self.measure(findings, device)]
            dist.broadcast_object_list(shared, src=0)  # rank 0's timings, so that every rank judges the same
            measured = shared[0]
        hosts, instance_type = len(self.plan.hosts), self.plan.instance_type or "an unknown instance type"
        bound = floor(self.min_busbw, self.plan.instance_type, hosts)
        failed, warnings = verdict(findings, measured, bound, self.mode)
        if trainer.is_global_zero:
            figure = instances.expected_busbw(self.plan.instance_type, hosts)
            expected = f"{figure.gbs:g} GB/s at {size(figure.at_bytes)}" if figure else "unknown"
            per_host = trainer.world_size // hosts
            seconds = time.perf_counter() - start
            say(summary(findings, measured, hosts, per_host, f"{expected} for {instance_type}", seconds))
            for warning in warnings:
                say(f"pre-flight warning: {warning}")
        if failed:
            raise UserError(failed)

    def local(self, trainer, device: torch.device) -> Findings:
        """This rank's devices and, on a job of several hosts, its host's EFA."""
        instance = instances.lookup(self.plan.instance_type)
        problems = [("devices", p) for p in device_problems(torch.cuda.device_count(), self.plan.gpus, instance)]
        devices = f"cpu with {torch.get_num_threads()} thread(s), not checked"  # shared in local mode (sagemaker.py)
        if device.type == "cuda":
            devices = f"ok ({torch.cuda.device_count()} GPUs)"
            if problem := compute_problem(device):
                problems.append(("devices", problem))
        efa_seen = "not needed (one host)"
        if len(self.plan.hosts) > 1:
            efa_seen, efa_problems = efa.findings(instance, os.environ, self.root)
            problems += [("EFA", p) for p in efa_problems]
        return Findings(trainer.global_rank, self.plan.host, devices, efa_seen, problems)

    def measure(self, findings: Sequence[Findings], device: torch.device) -> Measured:
        """Every rank calls it; rank 0's result counts. SMDDP has no send/recv: no point-to-point there."""
        sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
        measured = Measured({n: allreduce_busbw(n, device) for n in sizes}, {})
        if torch.distributed.get_backend() == "smddp":
            return measured
        leaders = {}  # each other host's first rank
        for found in findings:
            if found.host != findings[0].host:
                leaders.setdefault(found.host, found.rank)
        rank = torch.distributed.get_rank()
        for host, peer in leaders.items():
            if rank in (0, peer):
                gbs = exchange(peer, P2P_BYTES[device.type], device)
                if rank == 0:
                    measured.p2p[host] = gbs
        return measured


@declares(MODE, MIN_BUSBW)
def concern(ctx: Context) -> Part:
    """Preflight, in a job."""
    if not ctx.plan.in_job:
        return Part()
    mode, min_busbw = MODE.of(ctx.config), MIN_BUSBW.of(ctx.config)
    return Part(callbacks=[made(Preflight, ctx.pl)(ctx.plan, mode=mode, min_busbw=min_busbw)])
