"""The launch plan: the platform's environment, resolved once into who trains where and what torch.distributed,
Lightning, NCCL and gloo need to know.

`make_plan` is a pure function from an environment (a mapping of variable names to strings) plus the trainer's
resolved settings to an immutable Plan; `Plan.env` holds the variables to set. Nothing here starts a process,
resolves a name or reads a file, so every rule is unit-tested as a table (tests/unit/launch/test_plan.py). Each
platform's variables are read in platforms/ (SageMaker's SM_HOSTS, Kubeflow's PET_*, SLURM_*, torchrun's, in the order
platforms/recognise.py gives); SageMaker's paths come from paths.py, the network interfaces and EFA from network.py.
A process reads its environment once: the runtime's LightningCLI makes the plan from it (and from hyperparameters.json,
read once) before parsing, then completes that plan with the resolved trainer settings (Plan.completed), from the same
reading; this process's rank comes from it too (Plan.rank, Plan.rank_zero). No torch: the start-up hook (autoenv.py)
runs it in every Python process of the image.

Who started this process (Plan.launcher):
  process   the platform, one process per host (cluster.PER_HOST): Lightning starts one process per device from it,
            or, where Plan.torchrun is set (LAUNCHER=torchrun, a PyTorchJob or TrainJob, several processes on a host
            where the platform started one), the runtime runs torchrun in its place, which starts them
  torchrun  torchrun (or hyperpodrun): ranks from torchrun
  mpirun    SageMaker's MPI distributions: ranks from OMPI_COMM_WORLD_*
  srun      Slurm's tasks: ranks from SLURM_*
  none      no platform recognised: a single process, and the runtime's LightningCLI is Lightning's own

    SM_HOSTS='["algo-1","algo-2"]' SM_CURRENT_HOST=algo-2 SM_NUM_GPUS=0 \\
        python -c "import os; from sagemaker_lightning.launch import plan; print(plan.make_plan(os.environ, {'eth0'}).line())"
"""

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import network, paths
from sagemaker_lightning.launch.platforms import sagemaker
from sagemaker_lightning.launch.platforms.cluster import DEFAULT_MASTER_PORT, DEFAULT_TIMEOUT_S, PER_HOST
from sagemaker_lightning.launch.platforms.recognise import recognise
from sagemaker_lightning.launch.timeout import check_timeout

DEFAULT_CHANNEL = "training"  # the input channel that holds the data; DATA_CHANNEL in the environment names another
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # set for the torchrun the runtime starts: each attempt's store
# is new (stop/restarts.py, shared_store_line, says why)
FR_BUFFER_SIZE = "256"  # collectives torch's flight recorder keeps per process: several steps of DDP; each watchdog
# heartbeat reads them all (2,000: a 45 ms JSON dump every 2 s, 2 AMD EPYC cores, torch 2.14.1; 256: a few ms)


@dataclass(frozen=True, kw_only=True)
class Reading:
    """What a plan was made from besides the trainer's settings, kept so that completing it reads nothing again: each
    field is make_plan's argument of its name."""

    env: Mapping[str, str]  # the environment, as read
    interfaces: Collection[str]  # the network interfaces here
    checkpoint_dir: str | None  # the job's checkpoint_local_path (paths.checkpoint_dir), when it names one
    objective: str | None  # a tuning job's child: its objective (hyperparameters.objective)
    gpus: int  # the GPUs here, where the platform does not say
    hostname: str  # this host's name
    hyperparameters: Mapping[str, Any]  # the job's, typed, without SageMaker's own (hyperparameters.projects)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Where this process stands in its job. The defaults: no platform recognised, one host, nothing to set."""

    launcher: str = "none"  # who started this process: "process" (PER_HOST), "torchrun", "mpirun", "srun" or "none"
    hosts: tuple[str, ...] = ("localhost",)  # the job's hosts by node rank (SageMaker's sorted: algo-1, algo-2, ...)
    node_rank: int = 0  # this host's index in `hosts`
    processes_per_host: int = 1  # training processes on each host (trainer.devices)
    master_addr: str = "localhost"  # the first host: torch.distributed's rendezvous
    master_port: str = DEFAULT_MASTER_PORT
    backend: str | None = None  # "smddp" when the job enables SMDDP; None: Lightning's (NCCL on GPUs, gloo on CPUs)
    timeout_s: int = DEFAULT_TIMEOUT_S  # dist_timeout: joining and every collective
    channels: Mapping[str, str] = field(default_factory=dict)  # the job's input channels: name → directory
    data_channel: str = ""  # the channel that holds the data: `training`, or the one DATA_CHANNEL names
    checkpoint_dir: str | None = None  # synced to checkpoint_s3_uri and restored on a restarted job
    model_dir: str | None = None  # packed into model.tar.gz
    output_data_dir: str | None = None  # packed into output.tar.gz
    env: Mapping[str, str | None] = field(default_factory=dict)  # variables to set (None: to unset)
    instance_type: str = ""  # SM_CURRENT_INSTANCE_TYPE: "ml.p5.48xlarge"; "local" in local mode
    gpus: int = 0  # SM_NUM_GPUS: the GPUs the toolkit found on this host (elsewhere: the GPUs torch sees)
    platform: str = ""  # who runs the job (platforms/): "SageMaker", "Kubeflow", "Slurm", ...; "" for none
    torchrun: tuple[str, ...] = ()  # torchrun's options when the runtime starts torchrun here (strategy.py)
    job_name: str | None = None  # the SageMaker training job's name (TRAINING_JOB_NAME)
    objective: str | None = None  # a SageMaker tuning job's child: the metric its tuner ranks (validation:accuracy)
    reading: Reading | None = field(default=None, compare=False, repr=False)  # what `completed` makes the plan from

    @property
    def on_sagemaker(self) -> bool:
        """A SageMaker training job: its paths, channels and hyperparameters."""
        return self.platform == "SageMaker"

    @property
    def in_job(self) -> bool:
        """A platform's job: the runtime's guarantees (resume, stop, failure lines, hang line, pre-flight) are on."""
        return bool(self.platform)

    @property
    def host(self) -> str:
        return self.hosts[self.node_rank]

    @property
    def master(self) -> str:
        """torch.distributed's rendezvous and the job's TCP store: MASTER_ADDR:MASTER_PORT."""
        return f"{self.master_addr}:{self.master_port}"

    @property
    def hyperparameters(self) -> Mapping[str, Any]:
        """The job's hyperparameters, typed, without SageMaker's own: {} off SageMaker and where it sent none."""
        return self.reading.hyperparameters if self.reading and self.on_sagemaker else {}

    @property
    def rank(self) -> str:
        """This process's global rank as its launcher gave it ("?" where none did: the process launcher's ranks get
        theirs from the trainer)."""
        return self.env.get("RANK") or (self.reading.env.get("RANK") if self.reading else None) or "?"

    @property
    def rank_zero(self) -> bool:
        """Whether this process is global rank 0, before the trainer exists: under the process launcher, Lightning's
        own processes for local ranks 1.. have LOCAL_RANK; torchrun, mpirun and srun give every process its RANK (the
        plan sets srun's). Elsewhere, whichever of those a launcher set (SLURM's too) is 0, or none is set: a single
        process."""
        env = self.reading.env if self.reading else {}
        if self.launcher == PER_HOST:
            return self.node_rank == 0 and "LOCAL_RANK" not in env
        if self.launcher == "none":
            return all(env.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))
        return self.rank == "0"

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.processes_per_host

    def data_dir(self, strict: bool = True) -> str | None:
        """The data channel's directory; None when the job has no channels at all. A job whose channels lack that
        one is refused, naming the channels it has (None there too, when not `strict`)."""
        if self.data_channel in self.channels:
            return self.channels[self.data_channel]
        if self.channels and strict:
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

    @property
    def environment(self) -> dict[str, str]:
        """This process's environment as the plan leaves it (`apply` with override): what was read, its variables set."""
        env = dict(self.reading.env) if self.reading else {}
        self.apply(env, override=True)
        return env

    def completed(
        self, *, accelerator="auto", devices="auto", timeout_s=DEFAULT_TIMEOUT_S, workers=True, max_restarts=None
    ) -> "Plan":
        """This plan with the trainer's resolved settings (make_plan's), made from the same reading."""
        settings = {"accelerator": accelerator, "devices": devices, "timeout_s": timeout_s, "workers": workers}
        return make_plan(**vars(self.reading), **settings, max_restarts=max_restarts)

    def line(self) -> str:
        """The plan in one line, as rank 0 prints it at the start."""
        launcher = self.launcher if self.on_sagemaker else f"{self.launcher} ({self.platform})"
        return (
            f"launch: {launcher} on {','.join(self.hosts)}, this is {self.host} (node {self.node_rank}), "
            f"{self.processes_per_host} process(es) per host, world size {self.world_size}, "
            f"master {self.master}, backend {self.backend or 'nccl (GPU) / gloo (CPU)'}, "
            f"timeout {self.timeout_s} s"
        )


def wanted(env: Mapping[str, str], accelerator: str = "auto", devices="auto", gpus: int = 0) -> int:
    """Training processes per host the trainer asks for: trainer.devices when it is a count or a list, else one per
    GPU (SM_NUM_GPUS on SageMaker, `gpus` elsewhere) unless on the CPU, else 1 (never the host's cores)."""
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    gpus = int(env.get("SM_NUM_GPUS") or gpus or 0)
    return gpus if gpus > 0 and str(accelerator).lower() != "cpu" else 1


def recorder_env(env: Mapping[str, str], output_data_dir: str | None) -> dict[str, str]:
    """Torch's flight recorder, where the job sets none: a buffer, and (NCCL's own watchdog, at dist_timeout) a dump
    into output.tar.gz's folder."""
    out = {} if "TORCH_FR_BUFFER_SIZE" in env else {"TORCH_FR_BUFFER_SIZE": FR_BUFFER_SIZE}
    if output_data_dir and "TORCH_FR_DUMP_TEMP_FILE" not in env:
        out["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(paths.flight_recorder_dir(output_data_dir), "rank_")
        out.setdefault("TORCH_FR_DUMP_ON_TIMEOUT", env.get("TORCH_FR_DUMP_ON_TIMEOUT", "1"))
    return out


def streaming_env(env: Mapping[str, str], hosts: int, sagemaker: bool) -> dict[str, str]:
    """What litdata reads when a dataset is made: the node count (on CPUs it would count 1 node; on GPUs it guesses from
    the devices), and on SageMaker the cache for chunks on the job's volume, unless the job names another (elsewhere
    litdata's own default, or the job's)."""
    cache = env.get("LITDATA_CACHE_DIR") or (paths.streaming_cache_dir(env) if sagemaker else None)
    return {"NNODES": str(hosts), **({"LITDATA_CACHE_DIR": cache} if cache else {})}


def make_plan(
    env: Mapping[str, str],
    interfaces: Collection[str],
    *,
    accelerator: str = "auto",
    devices="auto",
    timeout_s: int = DEFAULT_TIMEOUT_S,
    checkpoint_dir: str | None = None,
    workers: bool = True,
    gpus: int = 0,
    hostname: str = "localhost",
    max_restarts: int | None = None,
    objective: str | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan for this process. `interfaces`: the network interfaces here; `accelerator`, `devices`: the trainer's
    settings (resolved from every source: YAML, --config, arguments); `checkpoint_dir`: the job's checkpoint_local_path
    (paths.checkpoint_dir), when it names one; `workers`: whether DataLoader workers fork; `gpus`: the GPUs here where
    the platform does not say (SageMaker's SM_NUM_GPUS); `hostname`: this host's name; `max_restarts`: torchrun's,
    where the runtime starts torchrun (None: the platform's, else 0); `objective`: a tuning job's, on its child
    (hyperparameters.objective), whose checkpoints then go to a folder of the child's own (paths.child_checkpoint_dir);
    `hyperparameters`: the job's, typed (hyperparameters.projects), as its arguments (cli/arguments.py)."""
    check_timeout(timeout_s)  # off any platform too: the strategy gets it
    reading = Reading(
        env=env,
        interfaces=interfaces,
        checkpoint_dir=checkpoint_dir,
        objective=objective,
        gpus=gpus,
        hostname=hostname,
        hyperparameters=hyperparameters or {},
    )
    per_host = wanted(env, accelerator, devices, gpus)
    found = recognise(env, per_host, hostname, max_restarts=max_restarts, timeout_s=timeout_s)
    if found is None:
        return Plan(timeout_s=timeout_s, reading=reading)
    out, on_sagemaker = dict(found.env), found.platform == "SageMaker"
    out.update(network.network_env(env, interfaces, workers))
    output_data_dir = paths.output_data_dir(env) if on_sagemaker else None
    out.update(recorder_env(env, output_data_dir))  # the flight recorder: hangs named (watchdog.py)
    if output_data_dir:  # what a plain script writes under its default root lands in output.tar.gz
        out["PL_TRAINER_DEFAULT_ROOT_DIR"] = output_data_dir
    out.update(streaming_env(env, len(found.hosts), on_sagemaker))  # litdata's streamed datasets (streaming.py)
    out.update(sagemaker.local_mode_threads(env, len(found.hosts) * found.processes_per_host))  # one machine's cores
    job_name, objective = (sagemaker.job_name(env), objective) if on_sagemaker else (None, None)
    if on_sagemaker:  # a tuning job's children share one CheckpointConfig: each keeps its files apart
        try:
            checkpoint_dir = paths.child_checkpoint_dir(
                checkpoint_dir or paths.default_checkpoint_dir(env), job_name, objective
            )
        except ValueError as e:
            raise UserError(str(e)) from None
    if found.torchrun and UNSHARED_STORE not in env:  # restarted ranks read no dead rank's address (restarts.py)
        out[UNSHARED_STORE] = "1"
    return Plan(
        launcher=found.launcher,
        hosts=found.hosts,
        node_rank=found.node_rank,
        processes_per_host=found.processes_per_host,
        master_addr=found.master_addr,
        master_port=found.master_port,
        backend="smddp" if on_sagemaker and sagemaker.smddp_enabled(env) else None,
        timeout_s=timeout_s,
        channels=paths.channels(env) if on_sagemaker else {},
        data_channel=env.get("DATA_CHANNEL", DEFAULT_CHANNEL),
        checkpoint_dir=checkpoint_dir,
        model_dir=paths.model_dir(env) if on_sagemaker else None,
        output_data_dir=output_data_dir,
        env=out,
        instance_type=env.get("SM_CURRENT_INSTANCE_TYPE", ""),
        gpus=int(env.get("SM_NUM_GPUS") or gpus or 0),
        platform=found.platform,
        torchrun=found.torchrun,
        job_name=job_name,
        objective=objective,
        reading=reading,
    )
