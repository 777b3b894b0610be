"""The launch plan: SageMaker's environment, resolved once into who trains where and what torch.distributed,
Lightning, NCCL and gloo need to know.

`make_plan` is a pure function from an environment (a mapping of variable names to strings) plus the trainer's
resolved settings to an immutable Plan; `Plan.env` holds the variables to set. Nothing here starts a process,
resolves a name or reads a file, so every rule is unit-tested as a table (tests/unit/test_plan.py). This is the only
module that reads SageMaker's variables on hosts and ranks (SM_HOSTS, SM_CURRENT_HOST, SM_NUM_GPUS, ...); its paths
come from paths.py, the network interfaces and EFA from network.py. No torch: the start-up hook (autoenv.py) runs it
in every Python process of the image.

Who started this process (SageMaker's `distribution`, or SDK 3.x's driver):
  process   one process per host (no distribution; SDK 3.x's basic driver): ranks from the host list, and
            Lightning starts one process per device
  torchrun  torch_distributed, SDK 3.x's Torchrun(): one process per device, ranks from torchrun
  mpirun    pytorchddp, smdistributed, mpi: one process per device, ranks from OMPI_COMM_WORLD_*
  none      not on SageMaker: Lightning finds its cluster itself

    SM_HOSTS='["algo-1","algo-2"]' SM_CURRENT_HOST=algo-2 SM_NUM_GPUS=0 \\
        python -c "import os; from sagemaker_lightning import plan; print(plan.make_plan(os.environ, {'eth0'}).line())"
"""

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from sagemaker_lightning import network, paths
from sagemaker_lightning.failure import UserError

DEFAULT_MASTER_PORT = "29500"  # torch.distributed's own default; MASTER_PORT (or SDK 3.x's SM_MASTER_PORT) wins
DEFAULT_CHANNEL = "training"  # the input channel that holds the data; DATA_CHANNEL in the environment names another
DEFAULT_TIMEOUT_S = 600  # seconds a rank waits for the others (dist_timeout); torch's own default is 30 minutes
MAX_TIMEOUT_S = 28 * 24 * 3600  # the longest a SageMaker job runs (MaxRuntimeInSeconds): no wait needs to be longer
FR_BUFFER_SIZE = "256"  # collectives torch's flight recorder keeps per process: several steps of DDP; each watchdog
# heartbeat reads them all (2,000: a 45 ms JSON dump every 2 s, 2 AMD EPYC cores, torch 2.14.1; 256: a few ms)


@dataclass(frozen=True)
class Plan:
    """Where this process stands in its job. Outside SageMaker: launcher "none", one host, nothing to set."""

    launcher: str  # "process", "torchrun", "mpirun" or "none" (module docstring)
    hosts: tuple[str, ...]  # the job's hosts in SageMaker's order (sorted: algo-1, algo-2, ...)
    node_rank: int  # this host's index in `hosts`
    processes_per_host: int  # training processes on each host (trainer.devices)
    master_addr: str  # the first host: torch.distributed's rendezvous
    master_port: str
    backend: str | None  # "smddp" when the job enables SMDDP; None: Lightning's choice (NCCL on GPUs, gloo on CPUs)
    timeout_s: int  # dist_timeout: joining and every collective
    channels: Mapping[str, str]  # the job's input channels: name → directory
    data_channel: str  # the channel that holds the data: `training`, or the one DATA_CHANNEL names
    checkpoint_dir: str | None  # synced to checkpoint_s3_uri and restored on a restarted job
    model_dir: str | None  # packed into model.tar.gz
    output_data_dir: str | None  # packed into output.tar.gz
    env: Mapping[str, str | None] = field(default_factory=dict)  # variables to set (None: to unset)
    instance_type: str = ""  # SM_CURRENT_INSTANCE_TYPE: "ml.p5.48xlarge"; "local" in local mode
    gpus: int = 0  # SM_NUM_GPUS: the GPUs the toolkit found on this host

    @property
    def on_sagemaker(self) -> bool:
        return self.launcher != "none"

    @property
    def host(self) -> str:
        return self.hosts[self.node_rank]

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.processes_per_host

    def data_dir(self) -> str | None:
        """The data channel's directory; None when the job has no channels at all. A job whose channels lack that
        one is refused, naming the channels it has."""
        if self.data_channel in self.channels:
            return self.channels[self.data_channel]
        if self.channels:
            raise UserError(
                f"the job has no input channel {self.data_channel!r} (it has {', '.join(self.channels)}); name the "
                f"data channel {self.data_channel!r} or set the environment variable DATA_CHANNEL to its name"
            )
        return None

    def settings(self) -> dict[str, str]:
        """The job's paths as configuration keys, given before the user's arguments (so theirs win)."""
        if not self.on_sagemaker:
            return {}
        keys = {
            "checkpoint.dirpath": self.checkpoint_dir,  # last.ckpt there is what a restarted job resumes from
            "model_dir": self.model_dir,  # model.pt and config.yaml, in model.tar.gz
            "trainer.default_root_dir": self.output_data_dir,  # what else the trainer writes, in output.tar.gz
            "logger.save_dir": self.output_data_dir and os.path.join(self.output_data_dir, "tensorboard"),
        }
        return {key: value for key, value in keys.items() if value}

    def apply(self, env, override: bool) -> None:
        """Set the plan's variables in `env` (os.environ): all of them (`override`: the runtime's LightningCLI, from
        the resolved configuration), or only those not set yet (the start-up hook: a job's own settings stay)."""
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            elif override:
                env[key] = value
            else:
                env.setdefault(key, value)

    def line(self) -> str:
        """The plan in one line, as rank 0 prints it at the start."""
        return (
            f"launch: {self.launcher} on {','.join(self.hosts)}, this is {self.host} (node {self.node_rank}), "
            f"{self.processes_per_host} process(es) per host, world size {self.world_size}, "
            f"master {self.master_addr}:{self.master_port}, backend {self.backend or 'nccl (GPU) / gloo (CPU)'}, "
            f"timeout {self.timeout_s} s"
        )


def launcher(env: Mapping[str, str]) -> str:
    """Which launcher started this process: "torchrun", "mpirun", "process" or "none" (module docstring)."""
    if "SM_HOSTS" not in env:  # the toolkit and SDK 3.x's driver export it on every SageMaker host
        return "none"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun"
    return "process"


def hosts(env: Mapping[str, str]) -> tuple[list[str], int]:
    """The job's hosts and this host's index among them (its node rank), from SM_HOSTS and SM_CURRENT_HOST."""
    raw = env.get("SM_HOSTS", "")
    try:
        names = json.loads(raw)
    except ValueError:
        names = None
    if not (isinstance(names, list) and names and all(isinstance(h, str) and h for h in names)):
        raise UserError(f'SM_HOSTS={raw!r} is not a JSON list of host names; expected e.g. ["algo-1","algo-2"]')
    if len(set(names)) != len(names):
        raise UserError(f"SM_HOSTS={raw!r} names a host twice; each host must appear once")
    current = env.get("SM_CURRENT_HOST", "")
    if current not in names:
        raise UserError(f"SM_CURRENT_HOST={current!r} is not in SM_HOSTS={raw}; set it to one of those hosts")
    return names, names.index(current)


def processes_per_host(env: Mapping[str, str], accelerator: str = "auto", devices="auto") -> int:
    """Training processes per host: what a launcher started (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE), else
    trainer.devices when it is a count or a list, else one per GPU (SM_NUM_GPUS) unless on the CPU, else 1."""
    for started in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if started in env and launcher(env) in ("torchrun", "mpirun"):
            return int(env[started])
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    gpus = int(env.get("SM_NUM_GPUS") or 0)
    return gpus if gpus > 0 and str(accelerator).lower() != "cpu" else 1


def smddp_enabled(env: Mapping[str, str]) -> bool:
    """Whether the job asks for SMDDP (distribution smdistributed.dataparallel, or its framework parameter)."""
    params = json.loads(env.get("SM_FRAMEWORK_PARAMS") or "{}")
    return params.get("sagemaker_distributed_dataparallel_enabled") in (True, "true", "True")


def _rank_env(env: Mapping[str, str], mode: str, names: list[str], node_rank: int, per_host: int) -> dict[str, str]:
    """torch.distributed's and Lightning's variables for the launcher that started this process."""
    master = {
        "MASTER_ADDR": env.get("MASTER_ADDR") or env.get("SM_MASTER_ADDR") or names[0],
        "MASTER_PORT": env.get("MASTER_PORT") or env.get("SM_MASTER_PORT") or DEFAULT_MASTER_PORT,
    }
    # Lightning reads these as Trainer defaults: a plain script's Trainer() spans the job without a change
    out = {"PL_TRAINER_NUM_NODES": str(len(names)), "PL_TRAINER_DEVICES": str(per_host)}
    if mode == "process":
        out.update(master, NODE_RANK=str(node_rank), WORLD_SIZE=str(len(names) * per_host))
    elif mode == "mpirun":
        rank, local_rank = int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_LOCAL_RANK"])
        # mpirun exported the first host's SM_CURRENT_HOST to every rank: this one is on host rank // per_host
        out.update(
            master,
            RANK=str(rank),
            WORLD_SIZE=str(len(names) * per_host),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(per_host),
            NODE_RANK=str(node_rank),
            SM_CURRENT_HOST=names[node_rank],
        )
    return out


def recorder_env(env: Mapping[str, str], output_data_dir: str | None) -> dict[str, str]:
    """Torch's flight recorder, where the job sets none: a buffer, and (NCCL's own watchdog, at dist_timeout) a dump
    into output.tar.gz's folder."""
    out = {} if "TORCH_FR_BUFFER_SIZE" in env else {"TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE}
    if output_data_dir and "TORCH_FR_DUMP_TEMP_FILE" not in env:
        out["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(paths.flight_recorder_dir(output_data_dir), "rank_")
        out.setdefault("TORCH_FR_DUMP_ON_TIMEOUT", env.get("TORCH_FR_DUMP_ON_TIMEOUT", "1"))
    return out


def streaming_env(env: Mapping[str, str], hosts: int) -> dict[str, str]:
    """What litdata reads when a dataset is made: the node count (on CPUs it would count 1 node; on GPUs it guesses from
    the devices), and the cache for chunks, the job's own unless the job names another."""
    return {"NNODES": str(hosts), "LITDATA_CACHE_DIR": env.get("LITDATA_CACHE_DIR") or paths.streaming_cache_dir(env)}


def check_timeout(seconds: int) -> int:
    """dist_timeout, when it is a wait torch can hold (timedelta overflows past 999,999,999 days) and a job can use."""
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise UserError(
            f"dist_timeout={seconds} must be a positive number of seconds, at most {MAX_TIMEOUT_S} (28 days, the "
            "longest a SageMaker job runs), e.g. 600"
        )
    return seconds


def make_plan(
    env: Mapping[str, str],
    interfaces: Collection[str],
    accelerator: str = "auto",
    devices="auto",
    timeout_s: int = DEFAULT_TIMEOUT_S,
    checkpoint_dir: str | None = None,
    workers: bool = True,
) -> Plan:
    """The plan for this process. `interfaces`: the network interfaces here; `accelerator`, `devices`: the trainer's
    settings (resolved from every source: YAML, --config, arguments); `checkpoint_dir`: the job's checkpoint_local_path
    (paths.checkpoint_dir), when it names one; `workers`: whether DataLoader workers fork."""
    check_timeout(timeout_s)  # off SageMaker too: the strategy gets it
    mode = launcher(env)
    if mode == "none":
        return Plan(
            "none", ("localhost",), 0, 1, "localhost", DEFAULT_MASTER_PORT, None, timeout_s, {}, "", None, None, None
        )
    names, node_rank = hosts(env)
    per_host = processes_per_host(env, accelerator, devices)
    if mode == "mpirun":
        size = int(env["OMPI_COMM_WORLD_SIZE"])
        if size != len(names) * per_host:
            raise UserError(
                f"mpirun started {size} processes, not {per_host} on each of {len(names)} hosts; "
                "set processes_per_host in the distribution to the same number on every host"
            )
        node_rank = int(env["OMPI_COMM_WORLD_RANK"]) // per_host  # mpirun fills each host's slots in host order
    out = _rank_env(env, mode, names, node_rank, per_host)
    out.update(network.network_env(env, interfaces, workers))
    output_data_dir = paths.output_data_dir(env)
    out.update(recorder_env(env, output_data_dir))  # the flight recorder: hangs named (watchdog.py)
    if output_data_dir:  # what a plain script writes under its default root lands in output.tar.gz
        out["PL_TRAINER_DEFAULT_ROOT_DIR"] = output_data_dir
    out.update(streaming_env(env, len(names)))  # litdata's streamed datasets (streaming.py)
    return Plan(
        launcher=mode,
        hosts=tuple(names),
        node_rank=node_rank,
        processes_per_host=per_host,
        master_addr=out.get("MASTER_ADDR") or env.get("MASTER_ADDR") or names[0],
        master_port=out.get("MASTER_PORT") or env.get("MASTER_PORT") or DEFAULT_MASTER_PORT,
        backend="smddp" if smddp_enabled(env) else None,
        timeout_s=timeout_s,
        channels=paths.channels(env),
        data_channel=env.get("DATA_CHANNEL", DEFAULT_CHANNEL),
        checkpoint_dir=checkpoint_dir or paths.default_checkpoint_dir(env),
        model_dir=paths.model_dir(env),
        output_data_dir=output_data_dir,
        env=out,
        instance_type=env.get("SM_CURRENT_INSTANCE_TYPE", ""),
        gpus=int(env.get("SM_NUM_GPUS") or 0),
    )


def check_world_size(plan: Plan, num_nodes: int, devices_per_node: int) -> None:
    """Fail before any collective call when the trainer's world differs from the cluster it runs on."""
    if not plan.on_sagemaker:
        return
    if num_nodes != len(plan.hosts):
        raise UserError(
            f"trainer.num_nodes={num_nodes} but the job has {len(plan.hosts)} hosts; "
            "leave trainer.num_nodes unset on SageMaker"
        )
    if devices_per_node != plan.processes_per_host:
        raise UserError(
            f"trainer.devices={devices_per_node} but the launcher started {plan.processes_per_host} processes per "
            "host; leave trainer.devices unset or set it to that number"
        )


def global_rank_zero(plan: Plan, env: Mapping[str, str]) -> bool:
    """Whether this process is global rank 0, before the trainer exists: under the process launcher, Lightning's own
    processes for local ranks 1.. have LOCAL_RANK; torchrun and mpirun give every process its RANK. Off SageMaker,
    whichever of those a launcher set (SLURM's too) is 0, or none is set: a single process."""
    if plan.launcher == "process":
        return plan.node_rank == 0 and "LOCAL_RANK" not in env
    if plan.launcher == "none":
        return all(env.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))
    return env.get("RANK") == "0"
