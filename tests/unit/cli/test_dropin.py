"""The runtime's LightningCLI off SageMaker is Lightning's: what a project built on Lightning's class meets, in this
project's words (scripts/lightning_cli_suite.py runs Lightning's own test file against it: make lightning-cli-suite).
Each test failed before issue 36's fix."""

import os
import pickle
import warnings

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch import cli as lightning_cli
from lightning.pytorch.callbacks import DeviceStatsMonitor, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from sagemaker_lightning import LightningCLI, progress
from sagemaker_lightning.boot import signals
from sagemaker_lightning.parallel import strategy
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit

TINY = ["--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false"]


@pytest.fixture(autouse=True)
def off_sagemaker(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith(("SM_", "SAGEMAKER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def callback_types(cli) -> list[str]:
    return [type(c).__name__ for c in cli.trainer.callbacks]


def test_the_trainer_has_lightnings_callbacks_plugins_and_progress_bar():
    args = ["--trainer.accelerator=cpu"]
    ours, theirs = (
        LightningCLI(BoringModel, args=args, run=False),
        lightning_cli.LightningCLI(BoringModel, args=args, run=False),
    )
    assert callback_types(ours) == callback_types(theirs)  # SaveConfigCallback last, where Lightning puts it
    assert type(ours.trainer.strategy.checkpoint_io) is type(theirs.trainer.strategy.checkpoint_io)
    assert ours.trainer.progress_bar_callback is not None  # no terminal here: Lightning still shows its bar


def test_the_projects_own_model_checkpoint_is_the_only_one(monkeypatch, tmp_path):
    own = ModelCheckpoint(monitor="loss")
    cli = LightningCLI(BoringModel, args=[], run=False, trainer_defaults={"callbacks": own})  # one, not a list
    assert [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)] == [own]


def test_a_single_callback_in_the_configuration():
    cli = LightningCLI(BoringModel, args=["--trainer.callbacks=DeviceStatsMonitor"], run=False)
    assert sum(isinstance(c, DeviceStatsMonitor) for c in cli.trainer.callbacks) == 1


def test_structured_arguments_and_a_trainer_builder_that_takes_few_of_trainers_arguments():
    def builder(limit_train_batches: int, callbacks: list[Callback] | None = None) -> Trainer:
        return Trainer(limit_train_batches=limit_train_batches, callbacks=callbacks, logger=False)

    cli = LightningCLI(BoringModel, trainer_class=builder, args={"trainer": {"limit_train_batches": 3}}, run=False)
    assert cli.trainer.limit_train_batches == 3


def test_a_trainer_class_without_callbacks_gets_lightnings_warning():
    class Bare(Trainer):
        def __init__(self):
            super().__init__(logger=False)

    with pytest.warns(UserWarning, match="does not expose the `callbacks` argument"):
        LightningCLI(BoringModel, trainer_class=Bare, args=[], run=False)


def test_a_config_file_chooses_the_subcommand(tmp_path):
    (tmp_path / "test.yaml").write_text("test:\n  trainer:\n    limit_test_batches: 1\n    logger: false\n")
    cli = LightningCLI(BoringModel, args=["--config", str(tmp_path / "test.yaml")])
    assert cli.subcommand == "test" and cli.trainer.limit_test_batches == 1


def test_subcommands_on_the_class_and_a_projects_own_subcommand(capsys):
    assert LightningCLI.subcommands() == lightning_cli.LightningCLI.subcommands()

    class Explaining(Trainer):
        def explain(self, model: BoringModel, depth: int = 1):
            """Say what the model is."""

    class CLI(LightningCLI):
        @staticmethod
        def subcommands():
            return {**LightningCLI.subcommands(), "explain": {"model"}}

    with pytest.raises(SystemExit):
        CLI(BoringModel, trainer_class=Explaining, args=["-h"])
    assert "Say what the model is." in capsys.readouterr().out


def test_a_caller_that_catches_gets_lightnings_exception_and_a_script_one_line(as_script, capsys, monkeypatch):
    class Failing(BoringModel):
        def on_fit_start(self):
            raise MisconfigurationException("the project's own check")

    with pytest.raises(MisconfigurationException, match="the project's own check"):
        LightningCLI(Failing, args=["fit", *TINY], save_config_callback=None)
    with pytest.raises(SystemExit) as exit:
        as_script(LightningCLI, Failing, args=["fit", *TINY], save_config_callback=None)  # `python train.py fit`
    err = capsys.readouterr().err
    assert exit.value.code == 1, err
    assert [line for line in err.splitlines() if line.startswith("ERROR: ")] == [
        "ERROR: MisconfigurationException: the project's own check"
    ], err


class ProjectCLI(LightningCLI):
    """A project's own subclass of the runtime's LightningCLI."""


def test_ddp_spawn_pickles_the_runtimes_strategy_callbacks_and_cli():
    import lightning.pytorch as pl

    lone = made(strategy.LoneDDP, pl)(start_method="spawn")
    copy = pickle.loads(pickle.dumps(lone))
    assert type(copy) is type(lone) and copy._start_method == "spawn"
    report = pickle.loads(pickle.dumps(made(progress.RankReport, pl)("algo-1")))
    assert type(report) is made(progress.RankReport, pl) and report.host == "algo-1"
    for cls in (LightningCLI, ProjectCLI):
        cli = cls(BoringModel, args=["--trainer.accelerator=cpu", "--trainer.logger=false"], run=False)
        assert type(pickle.loads(pickle.dumps(cli))) is type(cli) and isinstance(cli, cls)


def test_off_sagemaker_nothing_of_sagemakers_is_registered_and_the_environment_changes_as_lightnings_does(
    monkeypatch, tmp_path
):
    """Lightning's own tests fail one that leaves os.environ changed (its conftest): off any job, a fit with the
    runtime's class adds, changes or removes no variable beyond those a fit with Lightning's own does (it set
    goodput's SAGEMAKER_LIGHTNING_STARTED_AT: 79 of Lightning's CLI tests failed only with the runtime's class)."""
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    changed = {}
    for cls in (lightning_cli.LightningCLI, LightningCLI):
        before = dict(os.environ)
        with warnings.catch_warnings():
            cli = cls(BoringModel, args=["fit", *TINY], save_config_kwargs={"overwrite": True})
        changed[cls] = {k for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k)}
        os.environ.clear()
        os.environ.update(before)
    assert changed[LightningCLI] == changed[lightning_cli.LightningCLI], changed
    assert cli.trainer.global_step == 1 and not os.path.exists(signals.RUN_DIR)


def test_options_only_run_fit_as_a_jobs_command_line_does():
    """The one difference in parsing (README): what Lightning refuses, options without a subcommand or a config file
    that could choose one, runs fit, so the same command line runs here and on SageMaker."""
    cli = LightningCLI(BoringModel, args=TINY)
    assert cli.subcommand == "fit" and cli.trainer.global_step == 1


def test_a_projects_own_subcommand_runs():
    ran = []

    class Explaining(Trainer):
        def explain(self, model: BoringModel, depth: int = 1):
            """Say what the model is."""
            ran.append(depth)

    class CLI(LightningCLI):
        @staticmethod
        def subcommands():
            return {**LightningCLI.subcommands(), "explain": {"model"}}

    CLI(BoringModel, trainer_class=Explaining, args=["explain", "--depth=3", "--trainer.logger=false"])
    assert ran == [3]


def test_the_line_survives_torch_distributeds_own_excepthook(as_script, capsys):
    """init_process_group wraps sys.excepthook in one that buffers stderr and loses it when the wrapped hook exits."""

    class Failing(BoringModel):
        def on_fit_start(self):
            raise MisconfigurationException("a check under ddp")

    ddp = ["--trainer.strategy=ddp", "--trainer.devices=1", "--trainer.accelerator=cpu"]
    try:
        with pytest.raises(SystemExit) as exit:
            as_script(LightningCLI, Failing, args=["fit", *TINY, *ddp], save_config_callback=None)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert exit.value.code == 1
    assert "ERROR: MisconfigurationException: a check under ddp" in capsys.readouterr().err.splitlines()
