"""The network settings a SageMaker host's training processes need: the interface NCCL and gloo use, and libfabric's
EFA variables on instance types that have EFA (instances.py). Pure functions of the environment and the interfaces
present, part of the launch plan (plan.py). No torch.

    SM_CURRENT_INSTANCE_TYPE=ml.p5.48xlarge python -c "import os; from sagemaker_lightning.launch import network; print(network.network_env(os.environ, {'eth0'}, True))"
"""

from collections.abc import Collection, Mapping

from sagemaker_lightning.launch import instances


def _names_existing(variable: str, value: str, interfaces: Collection[str]) -> bool:
    """Whether an *_SOCKET_IFNAME value selects an interface here: NCCL reads "^a,b" as an exclusion list,
    "=a" as an exact name and "a" as a prefix; gloo reads exact names."""
    if variable.startswith("NCCL") and value.startswith("^"):
        return True
    names = value.lstrip("=").split(",")
    if variable.startswith("NCCL") and not value.startswith("="):
        return any(i.startswith(n) for n in names for i in interfaces)
    return all(n in interfaces for n in names)


def network_env(env: Mapping[str, str], interfaces: Collection[str], workers: bool) -> dict[str, str | None]:
    """Interface and EFA settings: only where neither the user nor the launcher set them, or set them to an
    interface this container lacks (SDK 3.x local mode names "ethwe"; the PyTorch toolkit passes it on).
    `workers`: whether DataLoader worker processes fork (they fail on huge-page EFA buffers)."""
    out: dict[str, str | None] = {}
    interface = env.get("SM_NETWORK_INTERFACE_NAME")
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        current = env.get(var)
        if current is not None and _names_existing(var, current, interfaces):
            continue
        if interface in interfaces:
            out[var] = interface
        elif current is not None:
            out[var] = None  # a name that is not here: unset, and gloo/NCCL pick an interface themselves
    instance_type = env.get("SM_CURRENT_INSTANCE_TYPE", "")
    rdma = instances.rdma(instance_type)
    if instances.efa(instance_type):
        efa = {"FI_PROVIDER": "efa"}  # NCCL over EFA through the aws-ofi-nccl plugin
        if rdma:
            efa["FI_EFA_USE_DEVICE_RDMA"] = "1"  # GPUDirect RDMA between GPU memory and the EFA device
        if workers:
            efa["FI_EFA_USE_HUGE_PAGE"] = "0"  # forked DataLoader workers fail on huge-page EFA buffers
        out.update({k: v for k, v in efa.items() if k not in env})
    return out
