"""EFA on this host, as pre-flight (preflight.py) checks it before the first step: the devices the kernel shows, NCCL's
net plugin (aws-ofi-nccl) where the loader finds it, and the variables that would keep NCCL or libfabric off EFA.
Pure functions of the environment and a filesystem root, so they are tested on a made-up sysfs. No torch.

    python -c "import os; from sagemaker_lightning.health import efa; from sagemaker_lightning.launch import instances; print(efa.findings(instances.lookup('ml.p5.48xlarge'), os.environ))"
"""

import glob
import os
from collections.abc import Mapping

from sagemaker_lightning.launch import instances

# where dlopen finds NCCL's net plugin besides LD_LIBRARY_PATH and /etc/ld.so.conf.d's folders
LOADER_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


def devices(root: str = "/") -> list[str]:
    """The EFA devices under /sys/class/infiniband: named efa_N on older kernels, rdmapNsN (driver efa) on newer."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "sys/class/infiniband/*"))):
        driver = os.path.basename(os.path.realpath(os.path.join(path, "device", "driver")))
        if "efa" in os.path.basename(path) or driver == "efa":
            found.append(os.path.basename(path))
    return found


def net_plugin(env: Mapping[str, str], root: str = "/") -> str | None:
    """The path of NCCL's net plugin (aws-ofi-nccl: libnccl-net.so, libnccl-net-ofi.so) where the loader finds it:
    LD_LIBRARY_PATH, /etc/ld.so.conf.d's folders, the system's; NCCL_NET_PLUGIN names another file."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for conf in sorted(glob.glob(os.path.join(root, "etc/ld.so.conf.d/*.conf"))):
        with open(conf) as f:
            dirs += [line.strip() for line in f if line.strip().startswith("/")]
    named = env.get("NCCL_NET_PLUGIN")
    if named and "/" in named:
        return named if os.path.exists(os.path.join(root, named.lstrip("/"))) else None
    pattern = f"libnccl-net-{named}.so*" if named else "libnccl-net*.so*"
    for d in [*dirs, *LOADER_DIRS]:
        if found := sorted(glob.glob(os.path.join(root, d.lstrip("/"), pattern))):
            return os.path.join(d, os.path.basename(found[0]))
    return None


def findings(instance: instances.Instance | None, env: Mapping[str, str], root: str = "/") -> tuple[str, list[str]]:
    """(what EFA looks like here, its problems) for a host of this type, from the environment and a sysfs root."""
    if instance is None or not instance.efa:
        return "not on this instance type", []
    found, plugin, problems = devices(root), net_plugin(env, root), []
    if not found:
        problems.append(f"{instance.name} has EFA but no EFA device shows in /sys/class/infiniband")
    if env.get("FI_PROVIDER", "efa") != "efa":
        problems.append(f"FI_PROVIDER={env['FI_PROVIDER']} points libfabric away from EFA (unset it)")
    if env.get("NCCL_NET") and not any(n in env["NCCL_NET"].lower() for n in ("ofi", "libfabric")):
        problems.append(f"NCCL_NET={env['NCCL_NET']} keeps NCCL off EFA (unset it)")
    if instance.rdma and env.get("FI_EFA_USE_DEVICE_RDMA", "1").lower() in ("0", "false", "no"):
        problems.append(f"FI_EFA_USE_DEVICE_RDMA={env['FI_EFA_USE_DEVICE_RDMA']} turns GPUDirect RDMA off (unset it)")
    if plugin is None:
        problems.append("the aws-ofi-nccl plugin (libnccl-net*.so) is not on the loader's path (LD_LIBRARY_PATH)")
    return f"{len(found)} of {instance.efa} devices, {os.path.basename(plugin or 'no plugin')}", problems
