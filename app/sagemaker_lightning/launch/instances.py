"""SageMaker's GPU instance types: GPUs per instance, EFA interfaces and GPUDirect RDMA, and the all-reduce bus
bandwidth (busbw) published for them, each figure next to its source. The one table of these facts: the launch plan
(network.network_env) sets libfabric's variables from it, pre-flight (preflight.py) checks a job against it. No torch.

busbw is nccl-tests' figure: bytes / time × 2(n−1)/n for an all-reduce among n ranks, in GB/s (10^9 bytes),
which is comparable across rank counts (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
A type without a published figure has none here: pre-flight then measures and prints, but never warns.

    python -c "from sagemaker_lightning.launch import instances; print(instances.expected_busbw('ml.p5.48xlarge', 2))"
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

GiB = 1 << 30

# GPUs and EFA interfaces (the most a type can attach) per instance: AWS's accelerated-computing network and
# hardware specifications, https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html
# 2× p4de.24xlarge and 2× p5.48xlarge all_reduce_perf, 8 B to 2 GiB / 16 GiB, 8 GPUs per host, out-of-place busbw
AWSOME = "https://github.com/aws-samples/awsome-distributed-training/blob/main/micro-benchmarks/nccl-tests/README.md"


# EFA with GPUDirect RDMA, every size of these families (AWS EFA docs); "p6" covers p6-b200, p6e-gb200 and later
RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2", "p6")


@dataclass(frozen=True)
class Figure:
    """A published all-reduce busbw: GB/s at `at_bytes` per rank, and where it was published."""

    gbs: float
    at_bytes: int
    source: str


@dataclass(frozen=True)
class Instance:
    name: str  # "ml.p5.48xlarge"
    gpus: int
    efa: int = 0  # EFA interfaces (0: none); the plan sets FI_PROVIDER=efa on these (network.network_env)
    busbw: Mapping[int, Figure] = field(default_factory=dict)  # hosts → the published figure

    @property
    def rdma(self) -> bool:
        """GPUDirect RDMA over EFA (FI_EFA_USE_DEVICE_RDMA=1): its family's."""
        return rdma(self.name)


TABLE: dict[str, Instance] = {
    i.name: i
    for i in [
        Instance("ml.p3.2xlarge", 1),
        Instance("ml.p3.8xlarge", 4),
        Instance("ml.p3.16xlarge", 8),  # V100, 25 Gbps, no EFA
        Instance("ml.p3dn.24xlarge", 8, efa=1),  # V100 32 GB, one 100 Gbps EFA, no GPUDirect RDMA
        # 76.79 GB/s at 1 GiB (78.33 at 2 GiB), 2× p4de.24xlarge, the README's "Results"
        Instance("ml.p4d.24xlarge", 8, efa=4),  # same network as p4de; no published 2-host figure found
        Instance("ml.p4de.24xlarge", 8, efa=4, busbw={2: Figure(76.79, GiB, AWSOME)}),
        # 436.95 GB/s at 1 GiB (443.72 at 2 GiB), 2× p5.48xlarge, the README's "Results"
        Instance("ml.p5.48xlarge", 8, efa=32, busbw={2: Figure(436.95, GiB, AWSOME)}),
        Instance("ml.p5e.48xlarge", 8, efa=32),  # H200, p5's network; no published 2-host figure found
        Instance("ml.p5en.48xlarge", 8, efa=16),  # H200, 16× 200 Gbps EFAv3; none found either
        Instance("ml.g4dn.xlarge", 1),
        Instance("ml.g4dn.8xlarge", 1, efa=1),
        Instance("ml.g4dn.12xlarge", 4, efa=1),
        Instance("ml.g4dn.16xlarge", 1, efa=1),
        Instance("ml.g5.xlarge", 1),
        Instance("ml.g5.2xlarge", 1),
        Instance("ml.g5.4xlarge", 1),
        Instance("ml.g5.8xlarge", 1),
        Instance("ml.g5.16xlarge", 1),
        Instance("ml.g5.12xlarge", 4),
        Instance("ml.g5.24xlarge", 4),
        Instance("ml.g5.48xlarge", 8, efa=1),  # A10G, one 100 Gbps EFA
        Instance("ml.g6.xlarge", 1),
        Instance("ml.g6.2xlarge", 1),
        Instance("ml.g6.4xlarge", 1),
        Instance("ml.g6.8xlarge", 1),
        Instance("ml.g6.12xlarge", 4),
        Instance("ml.g6.24xlarge", 4),
        Instance("ml.g6.48xlarge", 8, efa=1),  # L4, one 100 Gbps EFA
        Instance("ml.g6e.48xlarge", 8, efa=4),  # L40S, 4× 100 Gbps EFA
    ]
}


def lookup(instance_type: str | None) -> Instance | None:
    """The table's row for "ml.p5.48xlarge" or "p5.48xlarge"; None for local mode ("local", "local_gpu"), CPU types
    and types the table lacks."""
    if not instance_type:
        return None
    name = instance_type if instance_type.startswith("ml.") else f"ml.{instance_type}"
    return TABLE.get(name)


def family(instance_type: str) -> str:
    """ "p5" of "ml.p5.48xlarge" ("p5.48xlarge" too); "" for local mode and names of another shape."""
    parts = instance_type.removeprefix("ml.").split(".")
    return parts[0] if len(parts) == 2 else ""


def rdma(instance_type: str) -> bool:
    """Whether the type has EFA with GPUDirect RDMA: its family is one of RDMA_FAMILIES (p6's sizes by prefix)."""
    name = family(instance_type)
    return name in RDMA_FAMILIES or name.startswith("p6")


def efa(instance_type: str) -> bool:
    """Whether the type has EFA: an RDMA family's, or a row with EFA interfaces."""
    instance = lookup(instance_type)
    return rdma(instance_type) or bool(instance and instance.efa)


def expected_busbw(instance_type: str | None, hosts: int) -> Figure | None:
    """The published all-reduce busbw for `hosts` instances of this type, None where none is published."""
    instance = lookup(instance_type)
    return instance.busbw.get(hosts) if instance else None
