"""Pre-flight's verdict, pure and torch-free: from what every rank found and what rank 0 measured (preflight.py) to
the one failure line every rank raises, the warnings and rank 0's summary line; the busbw floor a job is held to.

    python -c "from sagemaker_lightning.health import preflight_verdict as v; print(v.floor(None, 'ml.p4d.24xlarge', 2))"
"""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sagemaker_lightning.launch import instances

MiB = 1 << 20  # the probes' sizes and the lines' unit
# the floor, as a fraction of a published figure: those are single runs of nccl-tests, 20 iterations each, with a
# software stack of their own (the same README shows 313 and 437 GB/s at 1 GiB on 2× p5 with different versions)
FLOOR_FRACTION = 0.8
SLOW = 0.5  # a host whose point-to-point bandwidth is below this fraction of the median of the others is named
FIX = {
    "devices": "stop the job and start it again on other instances, or set preflight=off to train anyway",
    "EFA": "NCCL would fall back to TCP at a fraction of the speed; fix the image or its settings, or set "
    "preflight=off to train anyway",
}


@dataclass
class Findings:
    """What one rank found on its own: its problems as (check, what), and what it saw, for the line."""

    rank: int
    host: str
    devices: str  # "ok (8 GPUs)" or "cpu with 2 thread(s), not checked"
    efa: str  # "4 of 4 devices, libnccl-net.so", "not on this instance type" or "not needed (one host)"
    problems: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Measured:
    """Rank 0's timings: all-reduce busbw by size, point-to-point GB/s by host."""

    busbw: dict[int, float]
    p2p: dict[str, float]


def device_problems(visible: int, sm_num_gpus: int, instance: instances.Instance | None) -> list[str]:
    """What is wrong with the GPUs torch sees on this host, given SM_NUM_GPUS and the instance type's row."""
    problems = []
    if sm_num_gpus and visible != sm_num_gpus:
        problems.append(f"torch sees {visible} GPU(s) but SM_NUM_GPUS={sm_num_gpus}")
    if instance and visible != instance.gpus:
        problems.append(f"torch sees {visible} GPU(s) but {instance.name} has {instance.gpus}")
    return problems


def busbw(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: the algorithm bandwidth × 2(n−1)/n."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def slow_hosts(p2p: Mapping[str, float], fraction: float = SLOW) -> list[str]:
    """The hosts whose point-to-point GB/s is below `fraction` of the median of the other hosts' (two at least)."""
    slow = []
    for host, gbs in p2p.items():
        others = [v for h, v in p2p.items() if h != host]
        if others and gbs < fraction * statistics.median(others):
            slow.append(host)
    return slow


def floor(min_busbw: float | None, instance_type: str, hosts: int) -> tuple[float, str] | None:
    """The busbw below which pre-flight warns or fails, and where it comes from; None: no floor."""
    if min_busbw is not None:
        return min_busbw, "preflight_min_busbw"
    if figure := instances.expected_busbw(instance_type, hosts):
        return FLOOR_FRACTION * figure.gbs, (
            f"{FLOOR_FRACTION:.0%} of the {figure.gbs:g} GB/s at {size(figure.at_bytes)} published for {hosts}× "
            f"{instance_type}, {figure.source}"
        )
    return None


def size(n: int) -> str:
    return f"{n // instances.GiB} GiB" if n >= instances.GiB else f"{n // MiB} MiB"


def verdict(
    findings: Sequence[Findings], measured: Measured | None, bound: tuple[float, str] | None, mode: str
) -> tuple[str | None, list[str]]:
    """(the failure line every rank raises, or None; the warnings rank 0 prints) from every rank's findings and rank
    0's measurements. The first problem in rank order names its host; a device or EFA problem always fails."""
    for found in findings:
        for check, what in found.problems:
            return f"pre-flight {check} check failed on host {found.host} (rank {found.rank}): {what}; {FIX[check]}", []
    warnings = []
    slow = slow_hosts(measured.p2p) if measured else []
    for host in slow:
        median = statistics.median(v for h, v in measured.p2p.items() if h != host)
        warnings.append(
            f"host {host} is slow: point-to-point {measured.p2p[host]:.2f} GB/s from the first host, the other "
            f"hosts' median {median:.2f} GB/s"
        )
    if measured and measured.busbw and bound:
        at, gbs = max(measured.busbw.items())
        if gbs < bound[0]:
            hosts = ", ".join(slow) if slow else ", ".join(dict.fromkeys(f.host for f in findings))
            line = (
                f"pre-flight bandwidth check on hosts {hosts}: all-reduce busbw {gbs:.2f} GB/s at {size(at)} is below "
                f"{bound[0]:g} GB/s ({bound[1]})"
            )
            if mode == "fail":
                return f"{line}; check EFA and the hosts' placement, or lower preflight_min_busbw", warnings
            warnings.append(line)
    return None, warnings


def summary(
    findings: Sequence[Findings], measured: Measured | None, hosts: int, per_host: int, expected: str, seconds: float
) -> str:
    """Rank 0's one line."""
    first = findings[0]
    parts = [f"pre-flight: {hosts} host{'s' * (hosts > 1)} × {per_host} process{'es' * (per_host > 1)}"]
    if measured and measured.busbw:
        at, gbs = max(measured.busbw.items())
        parts.append(f"all-reduce busbw {gbs:.2f} GB/s at {size(at)} (expected: {expected})")
    else:
        parts.append("no bandwidth probe (one process)")
    if measured and measured.p2p:
        parts.append("p2p to " + ", ".join(f"{h} {v:.2f} GB/s" for h, v in measured.p2p.items()))
    parts += [f"devices: {first.devices}", f"EFA: {first.efa}", f"{seconds:.1f} s (preflight=off skips it)"]
    return "; ".join(parts)
