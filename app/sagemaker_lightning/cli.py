"""The runtime's LightningCLI: Lightning's own, with the same signature and behaviour, plus what SageMaker needs.

    from sagemaker_lightning import LightningCLI
    LightningCLI(MyModel, MyDataModule)

It is a subclass of the LightningCLI of the package the project's classes are built on (lightning.pytorch or
pytorch_lightning: flavor.py), chosen when it is called, so a project's own subclass of it works with either. Off
SageMaker it only adds a few arguments (checkpoint, logger, model_dir, last_checkpoint_every_n_steps, dist_timeout,
preflight, preflight_min_busbw, scale_lr_by_world_size, the fsdp group of trainer.strategy=fsdp), one-line failures,
the precision for the machine when the project sets none (precision.py, said in one line), progress lines where there
is no terminal (callbacks.py), and only the warnings a user can act on (quiet.py). On SageMaker, in this order:
  1. arguments: SageMaker's typed hyperparameters (hyperparameters.py) for the ones a launcher rendered, `fit` when
     no subcommand is given (both SageMaker launchers start the script with options only), and the job's paths
     before them so that the user's win: checkpoint.dirpath, model_dir, logger.save_dir, trainer.default_root_dir, the data
     channel for the data module's data_dir (or the keys `data_channels` names);
  2. the launch plan (plan.py) from the environment and the resolved trainer settings; its variables set; printed;
  3. the trainer: devices and num_nodes of the plan, the strategy with the plan's cluster, backend and timeout
     (strategy.py; fsdp: sharding.py), last.ckpt every N steps / each epoch / on SIGTERM written atomically
     (checkpoints.py), plain log lines (callbacks.py), pre-flight checks before the first step (preflight.py), the
     export to model_dir (export.py), a training loader that resumes mid-epoch (resumable.py), and resume from the
     newest readable checkpoint;
  4. any failure: one line on stderr and in the failure file (failure.py), exit code 1 (143 when stopped).

    python app/example/train.py --help
"""

import functools
import logging
import os
import re
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from typing import Literal

from jsonargparse.typing import PositiveFloat

from sagemaker_lightning import (
    checkpoints,
    failure,
    flavor,
    hyperparameters,
    paths,
    precision,
    preflight,
    quiet,
    resumable,
    resume,
    sharded_checkpoints,
    sharding,
    signals,
    stop,
    strategy,
    watchdog,
)
from sagemaker_lightning.export import Export
from sagemaker_lightning.lines import say
from sagemaker_lightning.plan import DEFAULT_TIMEOUT_S, Plan, check_world_size, make_plan
from sagemaker_lightning.progress import LogLines, RankReport
from sagemaker_lightning.scaling import LinearLRScaling

SUBCOMMANDS = ("fit", "validate", "test", "predict")
LOST_PEER_WAIT_S = 3  # for a process of Lightning's launcher to end, when this one failed in a collective
SETTLE_S = 1.0  # after the process group is destroyed, for gloo's threads to let go of their last tensors (leave_process_group)
DEFAULT_DATA_KEY = "data_dir"  # the data module's argument that receives the data channel, unless data_channels says


@functools.cache
def _on(cls: type, pl) -> type:
    """`cls` (LightningCLI or a project's subclass of it) on top of package `pl`'s LightningCLI."""
    base = flavor.attribute(pl, "cli.LightningCLI")
    return type(cls.__name__, (cls, base), {"pl": pl, "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _interfaces() -> set[str]:
    return {name for _, name in socket.if_nameindex()}


class LightningCLI:
    """Lightning's LightningCLI on SageMaker (module docstring). Extra keyword argument:

    data_channels: SageMaker input channel → the data module argument that receives its directory, e.g.
        {"training": "root"}; default {DATA_CHANNEL or "training": "data_dir"}, applied when the data module has a
        data_dir argument (a named one must exist).
    """

    def __new__(cls, *args, **kwargs):
        classes = [kwargs.get("model_class"), kwargs.get("datamodule_class"), kwargs.get("trainer_class")]
        classes += list(args[:2])
        return object.__new__(_on(cls, flavor.package(*filter(None, classes))))

    def __init__(self, *args, data_channels: Mapping[str, str] | None = None, **kwargs):
        self.data_channels = dict(data_channels) if data_channels else None
        self.plan: Plan = make_plan({}, set())  # off SageMaker until the environment says otherwise
        self.precision: precision.Choice | None = None  # trainer.precision's, or the machine's (precision.py)
        quiet.install()  # after Lightning's import, whose own filters would otherwise come first
        self._stage = "configure"
        try:
            super().__init__(*args, **kwargs)
        except BaseException as e:
            if isinstance(e, SystemExit) and not isinstance(
                e, flavor.attribute(self.pl, "utilities.exceptions.SIGTERMException")
            ):
                raise  # --help, --print_config
            raise SystemExit(self.fail(e)) from None
        leave_process_group()
        if self.plan.on_sagemaker:  # run=False: what the project's own code raises later gets the same treatment
            sys.excepthook = lambda kind, e, tb: sys.exit(self.fail(e, tb))

    def fail(self, e: BaseException, tb=None) -> int:
        """Report `e` in one line (failure.EXCEPTIONS) and return the exit code."""
        if watchdog.ENDING.is_set():  # a peer left after the watchdog's line: this is its consequence, not a cause
            time.sleep(3 * watchdog.PERIOD_S)  # the watchdog's os._exit comes first
        trainer = getattr(self, "trainer", None)
        line, code, show_traceback, file = failure.explain(
            e,
            stage=self._stage,
            plan=self.plan,
            resolve=socket.gethostbyname,
            host=self.plan.host,
            rank=trainer.global_rank if trainer else os.environ.get("RANK", "?"),
            accelerator=self._setting("trainer.accelerator"),
            cuda_available=_cuda_available(),
            help=f"python {os.path.basename(sys.argv[0])} --help",
            ended=ended_children(trainer, wait_s=LOST_PEER_WAIT_S if isinstance(e, RuntimeError) else 0),
        )
        if show_traceback:
            traceback.print_exception(type(e), e, tb or e.__traceback__)
        failure.report(line, env=os.environ if file else {})
        return code

    def _setting(self, key: str):
        """A setting of the parsed configuration (inside the subcommand's, when there is one), or None."""
        config = getattr(self, "config", None)
        if config is None:
            return None
        sub = config.get("subcommand")
        return (config[sub] if sub else config).get(key)

    # ---- 1. arguments ---------------------------------------------------------------------------------------------

    def init_parser(self, **kwargs):
        kwargs.setdefault("exit_on_error", False)  # errors raise, and become one line (failure.py)
        return super().init_parser(**kwargs)

    def add_default_arguments_to_parser(self, parser) -> None:
        super().add_default_arguments_to_parser(parser)
        parser.add_lightning_class_args(flavor.attribute(self.pl, "callbacks.ModelCheckpoint"), "checkpoint")
        # TensorBoard, the trainer's logger unless trainer.logger names another (or false), as Lightning's default
        # is (lightning_logs/ under trainer.default_root_dir) unless logger.save_dir says where
        tensorboard = flavor.attribute(self.pl, "loggers.TensorBoardLogger")
        parser.add_class_arguments(tensorboard, "logger", instantiate=False, skip={"save_dir"})
        parser.add_argument("--logger.save_dir", type=str | None, default=None, help="TensorBoard's root directory")
        parser.add_argument(
            "--model_dir", type=str | None, default=None, help="where rank 0 writes model.pt and config.yaml after fit"
        )
        parser.add_argument(
            "--last_checkpoint_every_n_steps",
            type=int | None,
            default=None,
            help="last.ckpt every N optimizer steps, besides each epoch's end and SIGTERM (0: not by steps; "
            "null: not by steps where SIGTERM reaches the trainer, else about every minute of training)",
        )
        parser.add_argument(
            "--dist_timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds a rank waits for the others"
        )
        parser.add_argument(
            "--training_timeout",
            type=PositiveFloat | None,
            default=None,
            help="seconds a collective may take once training runs (null: 10x the median step, at least 120 s)",
        )
        parser.add_argument(
            "--preflight",
            type=Literal["warn", "fail", "off"],
            default="warn",
            help="checks before the first step (preflight.py): device and EFA problems fail; a busbw below the floor "
            "warns (warn) or fails (fail); off: none",
        )
        parser.add_argument(
            "--preflight_min_busbw",
            type=float | None,
            default=None,
            help="all-reduce busbw floor in GB/s; null: 80 %% of the published figure for the instance type and "
            "host count, where there is one (instances.py)",
        )
        parser.add_argument(
            "--scale_lr_by_world_size", type=bool, default=False, help="optimizer lr × number of processes"
        )
        parser.add_class_arguments(sharding.FSDPSettings, "fsdp")  # trainer.strategy=fsdp's settings (sharding.py)

    def parse_arguments(self, parser, args) -> None:
        if isinstance(args, Mapping) or hasattr(args, "as_dict"):
            return super().parse_arguments(parser, args)  # a structured configuration: as the project gives it
        argv = list(sys.argv[1:] if args is None else args)
        self.plan = make_plan(os.environ, _interfaces(), checkpoint_dir=paths.checkpoint_dir(os.environ))
        if self.plan.on_sagemaker:
            argv = hyperparameters.merge(argv, hyperparameters.read(os.environ))
        position = _options_start(argv, parser)
        if position is None:  # options only, as SageMaker's launchers start a script: fit
            argv, position = ["fit", *argv], 1
        given = [f"--{key}={value}" for key, value in self.plan.settings().items()]
        self.config = parser.parse_args(argv[:position] + given + argv[position:])
        data_key = self._data_key()
        if data_key and (data_dir := self.plan.data_dir()):
            given.append(f"--{data_key}={data_dir}")
            self.config = parser.parse_args(argv[:position] + given + argv[position:])

    def _data_key(self) -> str | None:
        """The configuration key that receives the data channel, when the data module has it."""
        if not self.plan.on_sagemaker:
            return None
        wanted = self.data_channels or {self.plan.data_channel: DEFAULT_DATA_KEY}
        if self.plan.data_channel not in wanted:
            return None
        name = wanted[self.plan.data_channel]
        for key in (f"data.{name}", f"data.init_args.{name}"):
            if key in self._subconfig():
                return key
        if self.data_channels:
            raise failure.UserError(
                f"data_channels maps {self.plan.data_channel!r} to {name!r}, which the data module does not take; "
                "name one of its arguments"
            )
        return None

    def _subconfig(self):
        sub = self.config.get("subcommand")
        return self.config[sub] if sub else self.config

    # ---- 2. the launch plan, 3. the trainer ----------------------------------------------------------------------

    def instantiate_classes(self) -> None:
        config = self._subconfig()
        trainer = config["trainer"]
        workers = next((config[k] for k in ("data.num_workers", "data.init_args.num_workers") if k in config), True)
        self.plan = make_plan(
            os.environ,
            _interfaces(),
            trainer.accelerator,
            trainer.devices,
            config["dist_timeout"],
            paths.checkpoint_dir(os.environ),
            bool(workers),
        )
        if self.plan.on_sagemaker:
            for key, value in self.plan.env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if trainer.num_nodes == 1:  # Lightning's default: the job's hosts (another number fails the world check)
                trainer.num_nodes = len(self.plan.hosts)
            if trainer.devices in ("auto", -1, "-1", None):
                trainer.devices = self.plan.processes_per_host
            if command := strategy.torchrun_command(self.plan, os.environ, sys.executable, sys.argv):
                os.execv(command[0], command)  # LAUNCHER=torchrun: torchrun starts one process per device instead
            _resolvable(self.plan.master_addr)
            if _global_rank_zero(self.plan, os.environ):
                say(self.plan.line())
            signals.register(os.getpid())  # the image's entrypoint passes SIGTERM on to this process
            if self.plan.launcher == "process":
                EndedChild(self.plan).attach()  # a local rank killed for memory is named, not this process
        check_writable({k: config.get(k) for k in ("model_dir", "checkpoint.dirpath", "logger.save_dir")})
        super().instantiate_classes()
        self._stage = "train"

    def instantiate_trainer(self, **kwargs):
        config = self._subconfig()
        model_checkpoint = self._get(self.config_init, "checkpoint")
        unprotected = None if not self.plan.on_sagemaker or signals.forwarded() else signals.why_unreached()
        made = functools.partial(flavor.made, pl=self.pl)
        watch = None
        if self.plan.on_sagemaker:  # a hang names itself, stragglers show (watchdog.py)
            timeouts = config["training_timeout"], self.plan.timeout_s
            watch = made(watchdog.Watchdog)(*timeouts, self.plan.host, self.plan.output_data_dir)
        callbacks = [
            made(RankReport)(self.plan.host if self.plan.on_sagemaker else socket.gethostname()),
            made(LogLines)(hosts=watch),
            made(checkpoints.LastCheckpoint)(config["last_checkpoint_every_n_steps"], model_checkpoint, unprotected),
            made(Export)(config["model_dir"], self._config_yaml),
            made(stop.StopTogether)(),
            made(preflight.Preflight)(self.plan, config["preflight"], config["preflight_min_busbw"]),
        ]
        if watch:
            callbacks.append(watch)
        if config["scale_lr_by_world_size"]:
            callbacks.append(made(LinearLRScaling)())
        trainer_config = self._get(self.config_init, "trainer", default={})
        if "precision" in trainer_config:  # a trainer class of the project's may not take it
            self.precision = _precision(trainer_config)
            kwargs["precision"] = self.precision.precision
            if _global_rank_zero(self.plan, os.environ):
                say(self.precision.line())
        kwargs["callbacks"] = [*(trainer_config.get("callbacks") or []), *callbacks]
        if trainer_config.get("logger") in (None, True):
            logger = self._get(self.config_init, "logger").as_dict()
            root = logger.pop("save_dir") or trainer_config.get("default_root_dir") or os.getcwd()
            kwargs["logger"] = flavor.attribute(self.pl, "loggers.TensorBoardLogger")(root, **logger)
        checkpoint_io = made(checkpoints.AtomicCheckpointIO)()
        kwargs["plugins"] = [*(trainer_config.get("plugins") or []), checkpoint_io]
        fsdp = self._get(self.config_init, "fsdp")
        kwargs.update(strategy.arguments(self.pl, self.plan, trainer_config, kwargs["plugins"], fsdp))
        if trainer_config.get("enable_progress_bar") is None:  # carriage returns make a mess of log files
            kwargs["enable_progress_bar"] = sys.stdout.isatty()
        trainer = super().instantiate_trainer(**kwargs)
        check_world_size(self.plan, trainer.num_nodes, trainer.num_devices)
        if self.plan.on_sagemaker:
            overridden = flavor.attribute(self.pl, "utilities.model_helpers.is_overridden")
            resumable.make_training_loader_resumable(self.datamodule or self.model, trainer, overridden)
        if model_checkpoint and model_checkpoint.dirpath:
            dirpath = model_checkpoint.dirpath
            if sharding.sharded(trainer.strategy):  # fsdp: the newest complete sharded save in last.ckpt/
                path = sharded_checkpoints.resume_path(dirpath, trainer.is_global_zero)
            else:  # global rank 0 chooses when the ranks have joined, every rank loads its choice (resume.py)
                sharded_checkpoints.refuse_sharded(dirpath)
                strict = getattr(self.model, "strict_loading", True)
                checkpoint_io.resume = resume.ResumePoint(dirpath, self.model.state_dict(), strict)
                path = checkpoint_io.resume.candidate
            if path:
                trainer.ckpt_path = path  # fit() resumes from it unless given another ckpt_path
        return trainer

    def _config_yaml(self) -> str:
        """The resolved configuration, as model_dir's config.yaml holds it."""
        return self._parser(self.subcommand).dump(self._subconfig(), skip_none=False)


def _options_start(argv: list[str], parser) -> int | None:
    """Where options go: after the subcommand (its index + 1), at 0 without subcommands, None when the parser has
    subcommands but argv names none."""
    if parser._subcommands_action is None:
        return 0
    expects_value = False
    for i, token in enumerate(argv):
        if expects_value:
            expects_value = False
        elif token in SUBCOMMANDS:
            return i + 1
        elif token.startswith("-"):
            expects_value = "=" not in token and token not in ("-h", "--help")
        else:
            return None  # a positional that is not a subcommand: the parser says what is wrong
    return None


def leave_process_group() -> None:
    """After a run that ended normally (every rank is past the export's broadcast: nothing pending, no peer gone), the
    process group and its subgroups (fsdp's device meshes) are destroyed here, whatever the backend (Lightning destroys
    NCCL's group at exit, not gloo's), and the process waits SETTLE_S with the GIL released: a gloo worker thread drops
    its last collective's tensors just after the collective completes, and needs the GIL for it; if the interpreter is
    finalizing by then, Python ends that thread mid-C++ and the finished job aborts (`terminate called without an
    active exception`, exit -6). Two-host fsdp on 2 AMD EPYC cores, torch 2.14.1 (scripts/soak_exit.py): 3 of 48 runs
    aborted with the group destroyed and no wait (at exit the group's threads still run: FSDP's state holds the
    group), 0 of 60 with the wait (20 of them with another process keeping one core busy). Not after a failure: a peer
    may be gone, and the teardown could wait for it."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        time.sleep(SETTLE_S)


def ended_children(trainer, wait_s: float = 0) -> list[tuple[int, int]]:
    """(local rank, exit code) of each process that Lightning's process launcher started here (local ranks 1..) and
    that ended with an error, waiting up to `wait_s` for one: a killed process's connections close before it ends."""
    procs = getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or []
    deadline = time.monotonic() + wait_s
    while not (ended := [(rank, p.returncode) for rank, p in enumerate(procs, start=1) if p.poll()]):
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return ended


class EndedChild(logging.Filter):
    """Lightning's process launcher checks its processes every few seconds; when one has ended with an error it logs
    so, then SIGKILLs them all, this one included (on GPUs the others wait in a collective meanwhile): the failure line
    is written on that log record, before the kill."""

    LOGGERS = [
        f"{fabric}.strategies.launchers.subprocess_script" for fabric in ("lightning_fabric", "lightning.fabric")
    ]
    RECORD = re.compile(r"\[rank: (\d+)\] Child process with PID \d+ terminated with code (-?\d+)")

    def __init__(self, plan: Plan):
        super().__init__()
        self.plan = plan

    def filter(self, record: logging.LogRecord) -> bool:
        if found := self.RECORD.search(record.getMessage()):
            local_rank, code = int(found[1]), int(found[2])
            rank = self.plan.node_rank * self.plan.processes_per_host + local_rank
            failure.report(failure.process_ended(self.plan.host, rank, local_rank, code))
        return True

    def attach(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)  # the record is an INFO one: seen even where Lightning is made quieter
            logger.addFilter(self)


def _precision(trainer: Mapping) -> precision.Choice:
    """trainer.precision when the project sets it, else the machine's (precision.py)."""
    if trainer["precision"] is not None:
        return precision.choose(None, trainer["precision"])
    return precision.choose(
        precision.probe(trainer.get("accelerator"), trainer.get("strategy")), strategy=trainer.get("strategy")
    )


def _global_rank_zero(plan: Plan, env: Mapping[str, str]) -> bool:
    """Before the trainer exists: under the process launcher, Lightning's own processes for local ranks 1.. have
    LOCAL_RANK; torchrun and mpirun give every process its RANK. Off SageMaker, whichever of those a launcher set
    (SLURM's too) is 0, or none is set: a single process."""
    if plan.launcher == "process":
        return plan.node_rank == 0 and "LOCAL_RANK" not in env
    if plan.launcher == "none":
        return all(env.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))
    return env.get("RANK") == "0"


def check_writable(paths: Mapping[str, str | None]) -> None:
    """Fail at the start, not after hours of training, when an output directory cannot be written."""
    for key, path in paths.items():
        if not path or "://" in path:
            continue
        try:
            os.makedirs(path, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        except OSError as e:
            raise failure.UserError(
                f"{key}={path} cannot be written ({e.strerror}); point it at a writable directory"
            ) from e


def _resolvable(host: str) -> None:
    try:
        socket.gethostbyname(host)
    except OSError as e:
        raise failure.UserError(
            f"cannot resolve the first host {host!r} ({e}); check the job's hosts and its network"
        ) from e


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch and torch.cuda.is_available())
