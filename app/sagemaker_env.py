"""SageMaker's training environment translated into what Lightning and torch.distributed need.

Pure functions from an environment (a mapping of variable names to strings) and the program's arguments
to new environment variables or new arguments. Nothing here starts a process, resolves a name or reads a
file: callers pass those in, so every rule is unit-tested without SageMaker.

    SM_HOSTS='["algo-1","algo-2"]' SM_CURRENT_HOST=algo-2 SM_NUM_GPUS=0 \
        python -c "import os, sagemaker_env as e; print(e.trainer_args(os.environ, []))"
"""

import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence

from failure import UserError

DEFAULT_MASTER_PORT = "29500"  # torch.distributed's own default; MASTER_PORT in the environment wins
DEFAULT_CHANNEL = "training"  # the input channel that holds the data; DATA_CHANNEL in the environment wins


def in_sagemaker(env: Mapping[str, str]) -> bool:
    """The training toolkit exports SM_HOSTS to the program on every SageMaker host (cloud and local mode)."""
    return "SM_HOSTS" in env


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
    """Training processes per host: --trainer.devices when it is a count or a list, else one per GPU, else 1."""
    given = _last_value(argv, "trainer.devices")
    try:
        parsed = json.loads(given) if given is not None else None
    except ValueError:
        parsed = None  # "auto" and the like: the default below
    if isinstance(parsed, int) and parsed > 0:
        return parsed
    if isinstance(parsed, list) and parsed:
        return len(parsed)
    gpus = int(env.get("SM_NUM_GPUS") or 0)
    on_cpu = (_last_value(argv, "trainer.accelerator") or "").lower() == "cpu"
    return gpus if gpus > 0 and not on_cpu else 1


def launch_env(
    env: Mapping[str, str],
    processes_per_host: int,
    resolve: Callable[[str], str],
    interfaces: Collection[str],
) -> dict[str, str]:
    """The environment for this host's training processes: torch.distributed's rendezvous variables.

    `resolve` maps a host name to its address; `interfaces` are the network interfaces in this container.
    """
    hosts, node_rank = cluster(env)
    try:
        master_addr = resolve(hosts[0])
    except OSError as e:
        raise UserError(f"cannot resolve the first host {hosts[0]!r} ({e}); check SM_HOSTS and the job's network") from e
    out = {k: v for k, v in env.items() if k != "LOCAL_RANK"}  # a set LOCAL_RANK makes Lightning wait for a launcher
    out.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=env.get("MASTER_PORT", DEFAULT_MASTER_PORT),
        NODE_RANK=str(node_rank),
        WORLD_SIZE=str(len(hosts) * processes_per_host),
    )
    interface = env.get("SM_NETWORK_INTERFACE_NAME")
    if interface in interfaces:  # SDK v3 local mode names "ethwe", which does not exist: then leave the choice to gloo/NCCL
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            out.setdefault(var, interface)
    return out


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
    world = env.get("WORLD_SIZE")
    if world is not None and int(world) != num_nodes * devices_per_node:
        raise UserError(
            f"WORLD_SIZE={world} but trainer.num_nodes × trainer.devices = {num_nodes} × {devices_per_node}; "
            "set trainer.devices to the number of processes per host"
        )


def sagemaker_values(argv: Sequence[str]) -> list[str]:
    """Hyperparameter values as SageMaker delivers them, in the parser's terms: `None` and an empty value mean null.

    The SDK turns a Python None into the string "None" (or JSON null, which the toolkit passes as ""); booleans
    arrive as True/False, which the parser already reads.
    """
    return ["null" if token in ("None", "") and i > 0 and argv[i - 1].startswith("--") else token for i, token in enumerate(argv)]
