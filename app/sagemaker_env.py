"""SageMaker's training environment translated into what Lightning and torch.distributed need.

Pure functions from an environment (a mapping of variable names to strings) and the program's arguments
to new environment variables, arguments or commands. Nothing here starts a process, resolves a name or
reads a file: callers pass those in, so every rule is unit-tested without SageMaker.

Who starts the training processes (SageMaker's `distribution`, see launcher()):
  process   one wrapper per host (no distribution); Lightning starts one process per device, or with
            LAUNCHER=torchrun the wrapper starts torchrun with c10d rendezvous on the first host
  torchrun  the toolkit's torch_distributed runner: one wrapper per device, ranks from torchrun
  mpirun    pytorchddp, smdistributed, mpi: one wrapper per device, ranks from OMPI_COMM_WORLD_*

    SM_HOSTS='["algo-1","algo-2"]' SM_CURRENT_HOST=algo-2 SM_NUM_GPUS=0 \
        python -c "import os, sagemaker_env as e; print(e.trainer_args(os.environ, []))"
"""

import json
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence

from failure import UserError

DEFAULT_MASTER_PORT = "29500"  # torch.distributed's own default; MASTER_PORT in the environment wins
DEFAULT_CHANNEL = "training"  # the input channel that holds the data; DATA_CHANNEL in the environment wins
LAUNCHERS = ("lightning", "torchrun")  # LAUNCHER in the job's environment, for one-wrapper-per-host jobs
# EFA with GPUDirect RDMA (AWS EFA docs); "p6" covers p6-b200, p6e-gb200 and later sizes
RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2")
EFA_TYPES = (
    "ml.g4dn.8xlarge",
    "ml.g4dn.12xlarge",
    "ml.g4dn.16xlarge",
    "ml.g5.48xlarge",
    "ml.g6.48xlarge",
    "ml.g6e.48xlarge",
    "ml.p3dn.24xlarge",
)  # EFA without GPUDirect RDMA


def in_sagemaker(env: Mapping[str, str]) -> bool:
    """The training toolkit exports SM_HOSTS to the program on every SageMaker host (cloud and local mode)."""
    return "SM_HOSTS" in env


def launcher(env: Mapping[str, str]) -> str:
    """Which launcher started this process: "torchrun", "mpirun" or "process" (the toolkit's Process runner)."""
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun"
    return "process"


def cluster(env: Mapping[str, str]) -> tuple[list[str], int]:
    """The job's hosts and this host's index among them (its node rank), from SM_HOSTS and SM_CURRENT_HOST."""
    raw = env.get("SM_HOSTS", "")
    try:
        hosts = json.loads(raw)
    except ValueError:
        hosts = None
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts)):
        raise UserError(f'SM_HOSTS={raw!r} is not a JSON list of host names; expected e.g. ["algo-1","algo-2"]')
    if len(set(hosts)) != len(hosts):
        raise UserError(f"SM_HOSTS={raw!r} names a host twice; each host must appear once")
    current = env.get("SM_CURRENT_HOST", "")
    if current not in hosts:
        raise UserError(f"SM_CURRENT_HOST={current!r} is not in SM_HOSTS={raw}; set it to one of those hosts")
    return hosts, hosts.index(current)


def _last_value(argv: Sequence[str], key: str) -> str | None:
    """The value of `--key value` or `--key=value` in argv (the last one wins, as in the parser)."""
    value = None
    for i, token in enumerate(argv):
        if token == f"--{key}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"--{key}="):
            value = token.split("=", 1)[1]
    return value


def devices(env: Mapping[str, str], argv: Sequence[str]) -> int:
    """Training processes per host: --trainer.devices when it is a count or a list, else what the launcher
    started (LOCAL_WORLD_SIZE), else one per GPU, else 1."""
    given = _last_value(argv, "trainer.devices")
    try:
        parsed = json.loads(given) if given is not None else None
    except ValueError:
        parsed = None  # "auto" and the like: the default below
    if isinstance(parsed, int) and parsed > 0:
        return parsed
    if isinstance(parsed, list) and parsed:
        return len(parsed)
    if "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_WORLD_SIZE"])
    gpus = int(env.get("SM_NUM_GPUS") or 0)
    on_cpu = (_last_value(argv, "trainer.accelerator") or "").lower() == "cpu"
    return gpus if gpus > 0 and not on_cpu else 1


def _names_existing(variable: str, value: str, interfaces: Collection[str]) -> bool:
    """Whether an *_SOCKET_IFNAME value selects an interface here: NCCL reads "^a,b" as an exclusion list,
    "=a" as an exact name and "a" as a prefix; gloo reads exact names."""
    if variable.startswith("NCCL") and value.startswith("^"):
        return True
    names = value.lstrip("=").split(",")
    if variable.startswith("NCCL") and not value.startswith("="):
        return any(i.startswith(n) for n in names for i in interfaces)
    return all(n in interfaces for n in names)


def network_env(env: Mapping[str, str], interfaces: Collection[str], argv: Sequence[str]) -> dict[str, str | None]:
    """Interface and EFA settings: only where neither the user nor the launcher set them, or set them to an
    interface this container lacks (SDK v3 local mode names "ethwe"; the PyTorch toolkit passes it on)."""
    out = {}
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
    family = instance_type.split(".")[1] if instance_type.count(".") == 2 else ""
    rdma = family in RDMA_FAMILIES or family.startswith("p6")
    if rdma or instance_type in EFA_TYPES:
        efa = {"FI_PROVIDER": "efa"}  # NCCL over EFA through the aws-ofi-nccl plugin
        if rdma:
            efa["FI_EFA_USE_DEVICE_RDMA"] = "1"  # GPUDirect RDMA between GPU memory and the EFA device
        if _last_value(argv, "data.num_workers") not in ("0", "null"):
            efa["FI_EFA_USE_HUGE_PAGE"] = "0"  # forked DataLoader workers fail on huge-page EFA buffers
        out.update({k: v for k, v in efa.items() if k not in env})
    return out


def _master(env: Mapping[str, str], hosts: list[str], resolve: Callable[[str], str]) -> dict[str, str]:
    try:
        address = resolve(hosts[0])
    except OSError as e:
        raise UserError(
            f"cannot resolve the first host {hosts[0]!r} ({e}); check SM_HOSTS and the job's network"
        ) from e
    return {"MASTER_ADDR": address, "MASTER_PORT": env.get("MASTER_PORT", DEFAULT_MASTER_PORT)}


def launch_env(
    env: Mapping[str, str],
    processes_per_host: int,
    resolve: Callable[[str], str],
    interfaces: Collection[str],
    argv: Sequence[str] = (),
) -> dict[str, str]:
    """The environment of train.py: torch.distributed's rendezvous variables for the launcher that ran us.

    `resolve` maps a host name to its address; `interfaces` are the network interfaces in this container.
    """
    hosts, node_rank = cluster(env)
    out = dict(env)
    mode = launcher(env)
    if mode == "process":
        out.pop("LOCAL_RANK", None)  # a set LOCAL_RANK makes Lightning wait for an outside launcher
        out.update(
            _master(env, hosts, resolve), NODE_RANK=str(node_rank), WORLD_SIZE=str(len(hosts) * processes_per_host)
        )
    elif mode == "mpirun":
        rank, size, local_rank, local_size = (
            int(env[f"OMPI_COMM_WORLD_{k}"]) for k in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")
        )
        if size != len(hosts) * local_size:
            raise UserError(
                f"mpirun started {size} processes, not {local_size} on each of {len(hosts)} hosts; "
                "set processes_per_host in the distribution to the same number on every host"
            )
        node_rank = rank // local_size  # mpirun fills each host's slots in host-list order
        # train.py is not an MPI process: no OMPI_/PMIX_ variables, and mpirun exported the first host's
        # SM_CURRENT_HOST to every rank
        out = {k: v for k, v in out.items() if not k.startswith(("OMPI_", "PMIX_"))}
        out.update(
            _master(env, hosts, resolve),
            RANK=str(rank),
            WORLD_SIZE=str(size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_size),
            NODE_RANK=str(node_rank),
            SM_CURRENT_HOST=hosts[node_rank],
        )
    for var, value in network_env(env, interfaces, argv).items():
        if value is None:
            out.pop(var, None)
        else:
            out[var] = value
    return out


def train_command(
    env: Mapping[str, str], processes_per_host: int, python: str, train_py: str, argv: Sequence[str]
) -> list[str]:
    """The command that runs the trainer on this host: train.py itself, or torchrun around it (LAUNCHER=torchrun)."""
    chosen = env.get("LAUNCHER", "lightning")
    if chosen not in LAUNCHERS:
        raise UserError(f"LAUNCHER={chosen!r} is not one of {', '.join(LAUNCHERS)}; unset it or pick one of those")
    if chosen == "lightning" or launcher(env) != "process":
        return [python, train_py, *argv]
    hosts, _ = cluster(env)
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={len(hosts)}",
        f"--nproc_per_node={processes_per_host}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        f"--rdzv_id={env.get('TRAINING_JOB_NAME') or 'sagemaker-lightning'}",
        "--max_restarts=0",
        *([f"--rdzv_conf=join_timeout={timeout}"] if (timeout := _last_value(argv, "dist_timeout")) else []),
        train_py,
        *argv,
    ]


def trainer_args(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """Arguments that put the trainer on SageMaker's cluster and paths; given before the user's, so theirs win."""
    if not in_sagemaker(env):
        return []
    hosts, _ = cluster(env)
    args = [f"--trainer.num_nodes={len(hosts)}", f"--trainer.devices={devices(env, argv)}"]
    channel = env.get("DATA_CHANNEL", DEFAULT_CHANNEL)
    channels = json.loads(env.get("SM_CHANNELS") or "[]")
    if channel in channels:
        args.append(f"--data.data_dir={env[f'SM_CHANNEL_{channel.upper()}']}")
    elif channels:
        raise UserError(
            f"the job has no input channel {channel!r} (it has {', '.join(channels)}); "
            f"name the data channel {channel!r} or set the environment variable DATA_CHANNEL to its name"
        )
    base = env.get("SAGEMAKER_BASE_DIR", "/opt/ml")  # the toolkit's own root, movable for tests
    args.append(f"--checkpoint.dirpath={os.path.join(base, 'checkpoints')}")  # synced to checkpoint_s3_uri
    if "SM_OUTPUT_DATA_DIR" in env:  # packed into output.tar.gz at the end of the job
        args.append(f"--logger.save_dir={os.path.join(env['SM_OUTPUT_DATA_DIR'], 'tensorboard')}")
    if "SM_MODEL_DIR" in env:  # packed into model.tar.gz at the end of the job
        args.append(f"--model_dir={env['SM_MODEL_DIR']}")
    return args


def check_world_size(env: Mapping[str, str], num_nodes: int, devices_per_node: int) -> None:
    """Fail before any collective call when the trainer's world differs from the cluster it runs on."""
    if not in_sagemaker(env):
        return
    hosts, _ = cluster(env)
    if num_nodes != len(hosts):
        raise UserError(
            f"trainer.num_nodes={num_nodes} but the job has {len(hosts)} hosts; leave trainer.num_nodes unset on SageMaker"
        )
    local = env.get("LOCAL_WORLD_SIZE")
    if local is not None and int(local) != devices_per_node:
        raise UserError(
            f"trainer.devices={devices_per_node} but the launcher started {local} processes per host; "
            "leave trainer.devices unset or set it to that number"
        )
    world = env.get("WORLD_SIZE")
    if world is not None and int(world) != num_nodes * devices_per_node:
        raise UserError(
            f"WORLD_SIZE={world} but trainer.num_nodes × trainer.devices = {num_nodes} × {devices_per_node}; "
            "set trainer.devices to the number of processes per host"
        )


def smddp_enabled(env: Mapping[str, str]) -> bool:
    """Whether the job asks for SMDDP (distribution smdistributed.dataparallel, or its framework parameter)."""
    params = json.loads(env.get("SM_FRAMEWORK_PARAMS") or "{}")
    return params.get("sagemaker_distributed_dataparallel_enabled") in (True, "true", "True")


def peer_failure(env: Mapping[str, str], message: str, resolve: Callable[[str], str]) -> str | None:
    """What a torch.distributed error means for this job, naming the host to look at; None when it is not one."""
    hosts, node_rank = cluster(env)
    others = ", ".join(h for i, h in enumerate(hosts) if i != node_rank) or "none"
    master = f"{env.get('MASTER_ADDR', hosts[0])}:{env.get('MASTER_PORT', DEFAULT_MASTER_PORT)}"
    if joined := re.search(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined", message):
        return (
            f"only {joined[2]} of {joined[3]} processes joined within {joined[1]} s: the other hosts ({others}) did not "
            f"start training or cannot reach {master}; see their logs (dist_timeout sets the wait)"
        )
    if re.search(r"connect\(\) timed out|Connection refused|failed to connect|Socket Timeout", message, re.I):
        return (
            f"could not reach the first host {hosts[0]} at {master} within dist_timeout: it did not start "
            "training or failed first; see its failure reason"
        )
    if lost := re.search(
        r"(?:Connection closed by peer|Connection reset by peer|Read error|Write error)\D*(\d+\.\d+\.\d+\.\d+)", message
    ):
        candidates = [h for i, h in enumerate(hosts) if i != node_rank] + [hosts[node_rank]]  # a local rank last
        named = [h for h in candidates if _address(resolve, h) == lost[1]]
        return (
            f"lost the connection to host {named[0] if named else lost[1]} during training: a process there "
            "stopped; its failure reason names the cause"
        )
    if re.search(r"timed out|timeout", message, re.I) and re.search(
        r"gloo|nccl|collective|barrier|broadcast|allreduce", message, re.I
    ):
        return f"a collective operation did not finish within dist_timeout: a process on another host ({others}) stopped or hangs"
    return None


def _address(resolve: Callable[[str], str], host: str) -> str | None:
    try:
        return resolve(host)
    except OSError:
        return None


MANGLED_DICT = re.compile(r"^[A-Za-z_][\w.]*=[^,]*(,[A-Za-z_][\w.]*=[^,]*)*$")  # the toolkit's k=v,k2=v2


def sagemaker_values(argv: Sequence[str]) -> list[str]:
    """Hyperparameter values as SageMaker delivers them, in the parser's terms.

    The SDK turns a Python None into the string "None" (or JSON null, which the toolkit passes as ""): null.
    A dict reaches the toolkit as JSON and leaves it as k=v,k2=v2: back to a {k: v, k2: v2} mapping.
    Booleans arrive as True/False and lists as Python's repr, which the parser reads as they are.
    """
    out = []
    for i, token in enumerate(argv):
        value = i > 0 and argv[i - 1].startswith("--")
        if value and token in ("None", ""):
            token = "null"
        elif value and MANGLED_DICT.match(token):
            token = "{" + ", ".join(": ".join(pair.split("=", 1)) for pair in token.split(",")) + "}"
        out.append(token)
    return out
