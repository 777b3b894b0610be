"""The runtime's LightningCLI: Lightning's own, with the same signature and behaviour, plus what a job needs.

    from sagemaker_lightning import LightningCLI
    LightningCLI(MyModel, MyDataModule)

It is a subclass of the LightningCLI of the package the project's classes are built on (lightning.pytorch or
pytorch_lightning: lightning_package.py), chosen when it is called, so a project's own subclass of it works with
either. Outside a platform's job (Plan.in_job: SageMaker, Kubeflow, Slurm, torchrun; launch/platforms/) it is
Lightning's (scripts/lightning_cli_suite.py runs Lightning's own tests against it): it adds the runtime's settings,
those its concerns declare, to the parser (settings.py), a one-line end to a script that fails (failure.py, through
sys.excepthook: a caller that catches gets Lightning's exception), the precision for the machine when the project sets
none (precision.py) and only the warnings a user can act on (quiet.py); resuming and last.ckpt start with
checkpoint.dirpath, the export with model_dir; options without a subcommand or a config file run fit, as in a job. In a
job, in this order:
  1. arguments (arguments.py; on SageMaker: its typed hyperparameters, `fit` when no subcommand is given, the job's
     paths before the user's arguments so that theirs win); errors raise, as one line;
  2. the launch plan (launch/plan.py), read from the environment when the CLI is made, completed with the resolved
     trainer settings, and the job started from it (job.py: its variables, torchrun where the plan says, the plan
     said, what a restart needs);
  3. the trainer, concern by concern: CONCERNS below, each of one shape (concern.py), in the callbacks' order; and
     trainer.precision, the machine's when the project sets none (precision.py), said in one line;
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

from sagemaker_lightning import failure, goodput, goodput_callback, progress
from sagemaker_lightning.boot import collector
from sagemaker_lightning.checkpoints import concern as checkpoints
from sagemaker_lightning.checkpoints.layout import MODEL_DIR
from sagemaker_lightning.cli import arguments, checks, job, precision, quiet, settings, subcommands
from sagemaker_lightning.data import training_loader
from sagemaker_lightning.health import preflight, watchdog
from sagemaker_lightning.health.heartbeats import PERIOD_S
from sagemaker_lightning.launch import here, started
from sagemaker_lightning.launch.plan import Plan, make_plan
from sagemaker_lightning.lines import say
from sagemaker_lightning.parallel import lr_scaling, strategy
from sagemaker_lightning.stop import agreement, process
from sagemaker_lightning.toolbox import lightning_package, redact
from sagemaker_lightning.toolbox.concern import CallbackOrder, Context, Steps, joined, listed
from sagemaker_lightning.toolbox.status import Status
from sagemaker_lightning.tracking import tensorboard, tracker

LOST_PEER_WAIT_S = 3  # for a process of Lightning's launcher to end, when this one failed in a collective
CONCERNS = (  # the trainer's concerns, each a function Context → Part (concern.py), in the callbacks' order
    strategy.concern,  # the plan's cluster, backend and timeout on any strategy; trainer.strategy=fsdp
    progress.concern,  # rank lines, progress and validation lines; no progress bar without a terminal
    checkpoints.concern,  # the resume point, last.ckpt, atomic writes, the export, the compile cache
    agreement.concern,  # every rank stops at the same step
    training_loader.concern,  # the training loader resumes mid-epoch (the runtime's, or litdata's streamed one)
    preflight.concern,  # checks before the first step
    watchdog.concern,  # a hang names itself, stragglers show
    lr_scaling.concern,  # scale_lr_by_world_size
    goodput_callback.concern,  # where the job's time went, at its end
    tracker.concern,  # MLflow, one run a job
    tensorboard.concern,  # TensorBoard, the trainer's logger unless trainer.logger names another
)


class LightningCLI:
    """Lightning's LightningCLI, and in a job what the job needs (module docstring). Extra keyword argument:

    data_channels: SageMaker input channel → the data module argument that receives its directory, e.g.
        {"training": "root"}; default {DATA_CHANNEL or "training": "data_dir"}, applied when the data module has a
        data_dir argument (a named one must exist).
    """

    BASE = "cli.LightningCLI"  # made (lightning_package.made) into a subclass of the project's package's, with a
    # project's own subclass of this one on top

    def __new__(cls, *args, **kwargs):
        classes = [kwargs.get("model_class"), kwargs.get("datamodule_class"), kwargs.get("trainer_class")]
        classes += list(args[:2])
        return object.__new__(lightning_package.made(cls, lightning_package.package(*filter(None, classes))))

    def __init__(self, *args, data_channels: Mapping[str, str] | None = None, **kwargs):
        self.data_channels = dict(data_channels) if data_channels else None
        self.plan: Plan = make_plan({}, set())  # until the environment's (which may fail in one line too)
        self.status = Status()  # what the watchdog shares with the other concerns and with fail()
        self.precision: precision.Choice | None = None  # trainer.precision's, or the machine's (precision.py)
        # this attempt's goodput, from its start: the container's (PID 1's record), else this process's
        self.goodput = goodput.Attempt(goodput.Ledger(), started.started_at(os.environ))
        self._stage = "configure"
        # a failure nobody catches (a script's, a job's) is one line; a caller that catches gets Lightning's exception
        sys.excepthook = functools.partial(self._uncaught, stderr=sys.stderr)
        quiet.install()  # after Lightning's import, whose own filters would otherwise come first
        self.plan = here.plan(os.environ)  # the environment, read once: instantiate_classes completes it (job.py)
        # in a job, the subcommand it runs where its command line tells (the one parser setup_parser builds)
        argv = _command_line(kwargs.get("args"))
        self._runs = (
            subcommands.run_by_job(argv, self.subcommands(), self.plan.on_sagemaker) if self.plan.in_job else None
        )
        if self.plan.in_job:  # a process torchrun starts here inherits the start; off a job the environment stays
            os.environ.setdefault(started.STARTED_AT, repr(self.goodput.start))  # as Lightning's own class leaves it
        # the subcommand runs in here: its goodput line is said last, after the process group's end (a second)
        self.goodput.deferred = kwargs.get("run", True)
        try:
            super().__init__(*args, **kwargs)
        except lightning_package.attribute(self.pl, "utilities.exceptions.SIGTERMException") as e:
            raise SystemExit(self.fail(e)) from None  # a stop: its line, and exit code 143
        process.leave_process_group()
        self.goodput.conclude()

    def _uncaught(self, kind, e: BaseException, tb, stderr) -> None:
        """sys.excepthook: the line, then the exit code. torch.distributed's init_process_group wraps the hook in its
        own, which buffers sys.stderr and would lose the line when this exits: it goes to the stderr of the start."""
        sys.stderr = stderr  # the wrapper puts its own back afterwards
        sys.exit(self.fail(e, tb))

    def fail(self, e: BaseException, tb=None) -> int:
        """Report `e` in one line (failure.EXCEPTIONS) and return the exit code."""
        if self.status.ending.is_set():  # a peer left after the watchdog's line: this is its consequence, not a cause
            time.sleep(3 * PERIOD_S)  # the watchdog's os._exit comes first
        trainer = getattr(self, "trainer", None)
        line, code, show_traceback, file = failure.explain(
            e,
            stage=self._stage,
            plan=self.plan,
            resolve=socket.gethostbyname,
            host=self.plan.host,
            rank=trainer.global_rank if trainer else self.plan.rank,
            accelerator=self._setting("trainer.accelerator"),
            cuda_available=process.cuda_available(),
            help=f"python {os.path.basename(sys.argv[0])} --help",
            ended=process.ended_children(trainer, wait_s=LOST_PEER_WAIT_S if isinstance(e, RuntimeError) else 0),
        )
        if show_traceback:
            traceback.print_exception(type(e), e, tb or e.__traceback__)
        failure.report(self.goodput.so_far(line), env=os.environ if file else {})  # where the time went until it
        return code

    def _setting(self, key: str):
        """A setting of the parsed configuration (inside the subcommand's, when there is one), or None."""
        return self._subconfig().get(key) if getattr(self, "config", None) is not None else None

    # ---- 2. arguments ------------------------------------------------------------------------------------------------

    def init_parser(self, **kwargs):
        if self.plan.in_job:
            kwargs.setdefault("exit_on_error", False)  # errors raise, and become one line (failure.py)
        return super().init_parser(**kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        """Lightning's parser; in a job that runs a subcommand known already, with only that one's parser. Each is the
        trainer's, the model's, the data's and the optimizers' arguments and the runtime's settings, resolved from
        their signatures: the three a job does not run were 0.3 s of its start-up (docs/performance.md)."""
        every = self.subcommands()
        if add_subcommands and self._runs in every:
            self.subcommands = lambda: {self._runs: every[self._runs]}  # which parsers Lightning builds
        try:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        finally:
            vars(self).pop("subcommands", None)

    def add_default_arguments_to_parser(self, parser) -> None:
        super().add_default_arguments_to_parser(parser)
        settings.add_to(parser, self.pl, CONCERNS)

    def parse_arguments(self, parser, args) -> None:
        if isinstance(args, Mapping) or hasattr(args, "as_dict"):
            return super().parse_arguments(parser, args)  # a structured configuration, as it is given
        argv = list(_command_line(args))
        if (config := arguments.parse(parser, argv, self.plan, self.data_channels, self.subclass_mode_data)) is None:
            return super().parse_arguments(parser, args)  # Lightning's, as it is
        self.config = config

    def _subconfig(self, config=None):
        """The subcommand's part of the configuration (the parsed one, or `config`)."""
        config = self.config if config is None else config
        sub = config.get("subcommand")
        return config[sub] if sub else config

    # ---- 3. the plan completed, 4. the trainer -----------------------------------------------------------------------

    def instantiate_classes(self) -> None:
        """The job started (job.py), then the project's classes and the trainer, as Lightning builds them."""
        config = self._subconfig()
        self.plan = job.completed(self.plan, config)
        job.start(self.plan, config)
        checks.check_writable({k: config.get(k) for k in (MODEL_DIR.key, "checkpoint.dirpath", "logger.save_dir")})
        super().instantiate_classes()
        collector.settle()  # the collector as Python's for the steps, where start-up paused it (boot/collector.py)
        self._stage = "train"

    def instantiate_trainer(self, **kwargs):
        """Lightning's trainer with the runtime's concerns (CONCERNS, in order); outside a job each gives nothing unless
        one of its settings is given (README: "Off SageMaker")."""
        init = self._subconfig(self.config_init)
        given = init.get("trainer") or {}
        extra = {key: init.get(key) for key in self._parser(self.subcommand).callback_keys}
        project = listed(kwargs.get("callbacks", given.get("callbacks")))  # the project's, as Lightning takes them
        model_checkpoint = self._model_checkpoint(project, extra)
        self.goodput.checkpoint = model_checkpoint  # the ledger goes beside its checkpoints
        ctx = Context(
            pl=self.pl,
            plan=self.plan,
            config=self._subconfig(),
            init=init,
            trainer=given,
            model=self.model,
            model_checkpoint=model_checkpoint,
            config_yaml=self._config_yaml,
            status=self.status,
            goodput=self.goodput,
        )
        parts = []
        for concern in CONCERNS:
            parts.append(concern(ctx))
            ctx.arguments.update(parts[-1].arguments)
        whole = joined(parts)
        steps = lightning_package.made(Steps, self.pl)([*whole.callbacks, *whole.after_checkpoints])
        whole.after_checkpoints += [steps] if steps.callbacks else []  # last: after every checkpoint's save
        order = (
            [lightning_package.made(CallbackOrder, self.pl)(whole.after_checkpoints)] if whole.after_checkpoints else []
        )
        kwargs["callbacks"] = [*order, *project, *whole.callbacks, *whole.after_checkpoints]
        if whole.plugins or "plugins" in whole.arguments:
            plugins = whole.arguments.get("plugins", listed(given.get("plugins")))
            whole.arguments["plugins"] = [*plugins, *whole.plugins]
        kwargs.update(whole.arguments)
        if "precision" in given:  # the machine's when unset; a trainer class of the project's may not take it
            self.precision = precision.for_trainer(given)
            kwargs["precision"] = self.precision.precision
            if ctx.plan.rank_zero:
                say(self.precision.line())
        trainer_config = {**given, **_accepted(self.trainer_class, kwargs)}
        trainer = self._instantiate_trainer(trainer_config, list(extra.values()))  # as Lightning's own method does
        checks.check_world_size(self.plan, trainer.num_nodes, trainer.num_devices)
        if whole.attach:
            whole.attach(trainer)  # what fit resumes from
        return trainer

    def _model_checkpoint(self, project: list, extra: dict):
        """The ModelCheckpoint the runtime's checkpointing follows: the trainer's in a job; elsewhere its own only. A
        project's own (in its callbacks or trainer_defaults') replaces the runtime's `checkpoint` (one ModelCheckpoint,
        as Lightning's CLI has), in a job writing to the job's checkpoint directory unless it names another."""
        model_checkpoint = lightning_package.attribute(self.pl, "callbacks.ModelCheckpoint")
        found = project + listed(self.trainer_defaults.get("callbacks"))
        own, ours = next((c for c in found if isinstance(c, model_checkpoint)), None), extra.get("checkpoint")
        if not own:
            return ours
        del extra["checkpoint"]
        if not self.plan.in_job:
            return None
        if own.dirpath is None:
            own.dirpath = ours.dirpath  # the job's checkpoint directory, which SageMaker syncs
        return own

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's: the subcommands and the trainer method arguments each skips."""
        return lightning_package.attribute(lightning_package.package(), "cli.LightningCLI").subcommands()

    def _config_yaml(self) -> str:
        """The resolved configuration, as model_dir's config.yaml holds it: its secrets redacted (redact.py), for
        whoever can read model.tar.gz may not be who may read the job's hyperparameters."""
        return redact.redacted_yaml(self._parser(self.subcommand).dump(self._subconfig(), skip_none=False))


def _command_line(args):
    """What a CLI parses: its `args` as given (a list, or a structured configuration), else the process's arguments."""
    return sys.argv[1:] if args is None else args


def _accepted(trainer_class, kwargs: dict) -> dict:
    """The arguments `trainer_class` takes (a project's trainer class, or a function that builds one, may take only
    some of Trainer's)."""
    parameters = inspect.signature(trainer_class).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in {p.name for p in parameters}}
