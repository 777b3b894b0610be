"""The runtime's LightningCLI: Lightning's own, with the same signature and behaviour, plus what SageMaker needs.

    from sagemaker_lightning import LightningCLI
    LightningCLI(MyModel, MyDataModule)

It is a subclass of the LightningCLI of the package the project's classes are built on (lightning.pytorch or
pytorch_lightning: lightning_package.py), chosen when it is called, so a project's own subclass of it works with either. Outside
a platform's job (plan.in_job: SageMaker, Kubeflow, Slurm, torchrun; platforms/) it is Lightning's
(scripts/lightning_cli_suite.py runs Lightning's own tests against it): it adds the
runtime's settings to the parser (settings.py), a one-line end to a script that fails (failure.py, through
sys.excepthook: a caller that catches gets Lightning's exception), the precision for the machine when the project sets
none (precision.py) and only the warnings a user can act on (quiet.py); resuming and last.ckpt start with
checkpoint.dirpath, the export with model_dir; options without a subcommand or a config file run fit, as on SageMaker.
In a job, in this order (1's hyperparameters and paths on SageMaker only):
  1. arguments: SageMaker's typed hyperparameters (hyperparameters.py) for the ones a launcher rendered, `fit` when
     no subcommand is given (both SageMaker launchers start the script with options only), and the job's paths
     before them so that the user's win: checkpoint.dirpath, model_dir, logger.save_dir, trainer.default_root_dir, the
     data channel for the data module's data_dir (or the keys `data_channels` names); errors raise, as one line;
  2. the launch plan (plan.py) from the environment and the resolved trainer settings; its variables set; the master
     resolvable; torchrun started where the plan says; printed; what a restart needs (restarts.py);
  3. the trainer, concern by concern (instantiate_trainer lists them): the strategy on the plan's cluster, backend
     and timeout (strategy.py; fsdp: fsdp.py), checkpoints and resume (checkpoints/), progress lines, the stop
     agreement (agreement.py), pre-flight (preflight.py), the watchdog (watchdog.py), lr scaling (lr_scaling.py),
     MLflow tracking (tracker.py);
  4. any failure: one line on stderr and in the failure file (failure.py), exit code 1 (143 when stopped).

    python app/example/train.py --help
"""

import functools
import inspect
import os
import socket
import sys
import time
import traceback
from collections.abc import Mapping

from sagemaker_lightning import failure, progress
from sagemaker_lightning.boot import signals
from sagemaker_lightning.checkpoints import concern as checkpoints
from sagemaker_lightning.cli import lightning_package, precision, quiet, redact, settings, subcommands
from sagemaker_lightning.data import streaming
from sagemaker_lightning.health import preflight, watchdog
from sagemaker_lightning.launch import hyperparameters, paths
from sagemaker_lightning.launch.plan import Plan, check_world_size, global_rank_zero, make_plan
from sagemaker_lightning.lines import say
from sagemaker_lightning.parallel import fsdp, lr_scaling, strategy
from sagemaker_lightning.stop import agreement, process, restarts
from sagemaker_lightning.tracking import tracker

LOST_PEER_WAIT_S = 3  # for a process of Lightning's launcher to end, when this one failed in a collective
DEFAULT_DATA_KEY = "data_dir"  # the data module's argument that receives the data channel, unless data_channels says


def _interfaces() -> set[str]:
    return {name for _, name in socket.if_nameindex()}


def _here() -> dict:
    """What the plan asks of this host where the platform does not say: its GPUs (torch is imported by now; the count
    does not initialise CUDA) and its name."""
    torch = sys.modules.get("torch")
    return {"gpus": torch.cuda.device_count() if torch else 0, "hostname": socket.gethostname()}


class LightningCLI:
    """Lightning's LightningCLI on SageMaker (module docstring). Extra keyword argument:

    data_channels: SageMaker input channel → the data module argument that receives its directory, e.g.
        {"training": "root"}; default {DATA_CHANNEL or "training": "data_dir"}, applied when the data module has a
        data_dir argument (a named one must exist).
    """

    BASE = "cli.LightningCLI"  # made (lightning_package.made) into a subclass of the project's package's, with a project's own
    # subclass of this one on top

    def __new__(cls, *args, **kwargs):
        classes = [kwargs.get("model_class"), kwargs.get("datamodule_class"), kwargs.get("trainer_class")]
        classes += list(args[:2])
        return object.__new__(lightning_package.made(cls, lightning_package.package(*filter(None, classes))))

    def __init__(self, *args, data_channels: Mapping[str, str] | None = None, **kwargs):
        self.data_channels = dict(data_channels) if data_channels else None
        self.plan: Plan = make_plan({}, set())  # until the environment's (which may fail in one line too)
        self.precision: precision.Choice | None = None  # trainer.precision's, or the machine's (precision.py)
        self._stage = "configure"
        # a failure nobody catches (a script's, a job's) is one line; a caller that catches gets Lightning's exception
        sys.excepthook = functools.partial(self._uncaught, stderr=sys.stderr)
        quiet.install()  # after Lightning's import, whose own filters would otherwise come first
        self.plan = make_plan(os.environ, _interfaces(), checkpoint_dir=paths.checkpoint_dir(os.environ), **_here())
        try:
            super().__init__(*args, **kwargs)
        except lightning_package.attribute(self.pl, "utilities.exceptions.SIGTERMException") as e:
            raise SystemExit(self.fail(e)) from None  # a stop: its line, and exit code 143
        process.leave_process_group()

    def _uncaught(self, kind, e: BaseException, tb, stderr) -> None:
        """sys.excepthook: the line, then the exit code. torch.distributed's init_process_group wraps the hook in its
        own, which buffers sys.stderr and would lose the line when this exits: it goes to the stderr of the start."""
        sys.stderr = stderr  # the wrapper puts its own back afterwards
        sys.exit(self.fail(e, tb))

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
            cuda_available=process.cuda_available(),
            help=f"python {os.path.basename(sys.argv[0])} --help",
            ended=process.ended_children(trainer, wait_s=LOST_PEER_WAIT_S if isinstance(e, RuntimeError) else 0),
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
        if self.plan.in_job:
            kwargs.setdefault("exit_on_error", False)  # errors raise, and become one line (failure.py)
        return super().init_parser(**kwargs)

    def add_default_arguments_to_parser(self, parser) -> None:
        super().add_default_arguments_to_parser(parser)
        settings.add_to(parser, self.pl)

    def parse_arguments(self, parser, args) -> None:
        if isinstance(args, Mapping) or hasattr(args, "as_dict"):
            return super().parse_arguments(parser, args)  # a structured configuration, as it is given
        argv = list(sys.argv[1:] if args is None else args)
        if not self.plan.on_sagemaker:
            if not subcommands.implies_fit(argv, parser):
                return super().parse_arguments(parser, args)  # Lightning's, as it is
            self.config = parser.parse_args(["fit", *argv])  # options only: fit, as a job's command line runs
            return
        argv = hyperparameters.merge(argv, hyperparameters.read(os.environ))
        position = subcommands.options_start(argv, parser)
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
        trainer = config.get("trainer") or {}  # a project's trainer class may take none of Trainer's arguments
        workers = next((config[k] for k in ("data.num_workers", "data.init_args.num_workers") if k in config), True)
        self.plan = make_plan(
            os.environ,
            _interfaces(),
            trainer.get("accelerator", "auto"),
            trainer.get("devices", "auto"),
            config["dist_timeout"],
            paths.checkpoint_dir(os.environ),
            bool(workers),
            max_restarts=config["max_restarts"],
            **_here(),
        )
        if self.plan.in_job:
            self.plan.apply(os.environ, override=True)
            if trainer.get("num_nodes") == 1:  # Lightning's default: the job's hosts (another fails the world check)
                trainer.num_nodes = len(self.plan.hosts)
            if "devices" in trainer and trainer.devices in ("auto", -1, "-1", None):
                trainer.devices = self.plan.processes_per_host
            process.check_resolvable(self.plan.master_addr, self.plan.timeout_s)
            if command := strategy.torchrun_command(self.plan, sys.executable, sys.argv):
                os.execv(command[0], command)  # torchrun starts one process per device instead (Plan.torchrun)
            rank_zero = global_rank_zero(self.plan, os.environ)
            if rank_zero:
                say(self.plan.line())
            restarts.announce(self.plan, config.get("checkpoint.dirpath"), os.environ, rank_zero)
            signals.register(os.getpid())  # the image's entrypoint passes SIGTERM on to this process
            if self.plan.launcher == "process":
                process.EndedChild(self.plan).attach()  # a local rank killed for memory is named, not this process
        process.check_writable({k: config.get(k) for k in ("model_dir", "checkpoint.dirpath", "logger.save_dir")})
        super().instantiate_classes()
        self._stage = "train"

    def instantiate_trainer(self, **kwargs):
        """Lightning's trainer with the runtime's concerns, in this order; each concern's module gives its part, and
        off SageMaker gives nothing unless one of its settings is given (README: "Off SageMaker")."""
        config, given = self._subconfig(), self._get(self.config_init, "trainer", default={})
        pl, plan, rank_zero = self.pl, self.plan, global_rank_zero(self.plan, os.environ)
        extra = {key: self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys}
        listed = _listed(kwargs.get("callbacks", given.get("callbacks")))  # the project's, as Lightning takes them
        own, ours = self._own_model_checkpoint(listed), extra.get("checkpoint")
        if own:  # the project's, instead of the runtime's `checkpoint`: one ModelCheckpoint, as Lightning's CLI has
            del extra["checkpoint"]
            if plan.in_job and own.dirpath is None:
                own.dirpath = ours.dirpath  # the job's checkpoint directory, which SageMaker syncs
        # what the runtime's checkpointing follows: the trainer's ModelCheckpoint in a job; elsewhere its own only
        model_checkpoint = own if own and plan.in_job else None if own else ours
        fsdp_settings = self._get(self.config_init, "fsdp")
        kwargs.update(strategy.arguments(pl, plan, given, _listed(given.get("plugins")), fsdp_settings))
        sharded = fsdp.sharded(kwargs.get("strategy"))
        point = checkpoints.resume_point(model_checkpoint, self.model, sharded, rank_zero)  # what fit resumes from
        watch = watchdog.callbacks(pl, plan, config)  # a hang names itself, stragglers show
        kwargs["callbacks"] = [
            *listed,
            *progress.callbacks(pl, plan, hosts=next(iter(watch), None)),  # rank lines, progress lines
            *checkpoints.callbacks(pl, plan, config, model_checkpoint, point, self._config_yaml),
            *agreement.callbacks(pl, plan),  # every rank stops at the same step
            *streaming.callbacks(pl, plan),  # streamed data (litdata) resumes exactly
            *preflight.callbacks(pl, plan, config),  # checks before the first step
            *watch,
            *lr_scaling.callbacks(pl, config),  # scale_lr_by_world_size
            *tracker.callbacks(pl, plan, config, given.get("logger"), self._config_yaml),  # MLflow, one run a job
        ]
        plugins = checkpoints.plugins(pl, plan.in_job, point)
        if plugins or "plugins" in kwargs:
            kwargs["plugins"] = [*kwargs.get("plugins", _listed(given.get("plugins"))), *plugins]
        kwargs.update(progress.arguments(plan, given))  # in a job, no progress bar without a terminal
        kwargs.update(settings.logger(pl, self._get(self.config_init, "logger"), given))  # TensorBoard by default
        if "precision" in given:  # the machine's when unset; a trainer class of the project's may not take it
            self.precision = precision.for_trainer(given)
            kwargs["precision"] = self.precision.precision
            if rank_zero:
                say(self.precision.line())
        trainer_config = {**given, **_accepted(self.trainer_class, kwargs)}
        trainer = self._instantiate_trainer(trainer_config, list(extra.values()))  # as Lightning's own method does
        check_world_size(plan, trainer.num_nodes, trainer.num_devices)
        checkpoints.attach(pl, plan, trainer, self.datamodule or self.model, point)  # mid-epoch loader, ckpt_path
        return trainer

    def _own_model_checkpoint(self, listed: list):
        """The project's own ModelCheckpoint: in the trainer's callbacks or trainer_defaults'."""
        model_checkpoint = lightning_package.attribute(self.pl, "callbacks.ModelCheckpoint")
        listed = listed + _listed(self.trainer_defaults.get("callbacks"))
        return next((c for c in listed if isinstance(c, model_checkpoint)), None)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's: the subcommands and the trainer method arguments each skips."""
        return lightning_package.attribute(lightning_package.package(), "cli.LightningCLI").subcommands()

    def _config_yaml(self) -> str:
        """The resolved configuration, as model_dir's config.yaml holds it: its secrets redacted (redact.py), for
        whoever can read model.tar.gz may not be who may read the job's hyperparameters."""
        return redact.redacted_yaml(self._parser(self.subcommand).dump(self._subconfig(), skip_none=False))


def _listed(value) -> list:
    """A trainer argument that takes one item or a list of them (callbacks, plugins), as a list."""
    return [] if value is None else list(value) if isinstance(value, list | tuple) else [value]


def _accepted(trainer_class, kwargs: dict) -> dict:
    """The arguments `trainer_class` takes (a project's trainer class, or a function that builds one, may take only
    some of Trainer's)."""
    parameters = inspect.signature(trainer_class).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in {p.name for p in parameters}}
