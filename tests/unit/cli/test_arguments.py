"""How a job's command line is parsed, a cost of every job's start-up (docs/performance.md): the parser of the one
subcommand it runs, the data channel given in the one parse (cli/arguments.py, cli/subcommands.py)."""

import os

import pytest

import train

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "job, args, built",
    [
        (True, [], {"fit"}),  # options only, as SageMaker's launchers start a script: fit
        (True, ["validate"], {"validate"}),
        (False, ["fit"], {"fit", "validate", "test", "predict"}),  # off a job, Lightning's parser as it is
    ],
)
def test_a_job_builds_the_parser_of_the_subcommand_it_runs_only(job, args, built, request, monkeypatch):
    """Each subcommand's parser resolves the trainer's, model's and data's signatures, a cost of start-up: a job whose
    command line says which subcommand it runs builds that one's alone."""
    import lightning.pytorch.cli
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI

    if job:
        request.getfixturevalue("on_sagemaker")
    monkeypatch.setattr(lightning.pytorch.cli.LightningCLI, "_run_subcommand", lambda self, subcommand: None)
    cli = LightningCLI(BoringModel, args=[*args, "--trainer.accelerator=cpu", "--trainer.logger=false"])
    assert set(cli.parser._subcommands_action.choices) == built and cli.subcommand == (args or ["fit"])[0]
    assert "subcommands" not in vars(cli)  # the class's again (a lambda would not pickle for ddp_spawn)


@pytest.mark.parametrize("data", ["by class", "plain", "none", "refused"])
def test_the_data_channel_is_given_in_the_one_parse(data, on_sagemaker, tmp_path, monkeypatch, capsys):
    """A parse is a cost of start-up: the channel goes to the data module's data_dir in the one parse of the command
    line, under init_args where the module is chosen by class; a module without data_dir needs a second, and says
    nothing of it; one whose data_dir refuses the channel's directory fails on it."""
    import lightning.pytorch as lp
    from jsonargparse import ArgumentError, ArgumentParser
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI

    kind = int if data == "refused" else str  # a directory is no int

    class Folder(lp.LightningDataModule):
        def __init__(self, data_dir: kind = 0):
            super().__init__()
            self.data_dir = data_dir

    channel = {"SM_CHANNELS": '["training"]', "SM_CHANNEL_TRAINING": str(tmp_path / "training")}
    monkeypatch.setattr(os, "environ", {**os.environ, **channel})
    parses = []
    parse_args = ArgumentParser.parse_args
    monkeypatch.setattr(
        ArgumentParser, "parse_args", lambda self, *a, **k: parses.append(1) or parse_args(self, *a, **k)
    )
    args = ["--trainer.accelerator=cpu", "--trainer.logger=false"]
    if data == "refused":
        with pytest.raises(ArgumentError, match="data_dir"):
            LightningCLI(BoringModel, Folder, args=args, run=False)
        return
    if data == "by class":
        cli = train.main(args, run=False)  # the example's: --data picks a data module by class name
    else:
        cli = LightningCLI(BoringModel, Folder if data == "plain" else None, args=args, run=False)
    assert len(parses) == (2 if data == "none" else 1) and "data_dir" not in capsys.readouterr().err
    assert getattr(cli.datamodule, "data_dir", None) == (None if data == "none" else str(tmp_path / "training"))
