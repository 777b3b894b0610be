"""The example's LightningCLI (the runtime's, as a user's project has it) with hyperparameters as SageMaker
delivers them: through the real conversions (the SDK's to_string, the toolkit's JSON decoding and to_cmd_args) and
the runtime's typed hyperparameters.json."""

import json
import os

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from sagemaker.utils import to_string
from sagemaker_training import environment, mapping

import train
from data import CIFAR10DataModule
from device_data import DeviceCIFAR10DataModule
from sagemaker_lightning.launch import hyperparameters

pytestmark = pytest.mark.unit

# The Estimator hyperparameters of Martin Krasser, "Using AWS SageMaker with minimal dependencies, part 1: Distributed
# model training with PyTorch Lightning" (https://krasserm.github.io/2022/01/21/sagemaker-multi-node/): its run_sagemaker.py's with its
# README's CPU settings, unchanged
KRASSER_PART1 = {
    "data": "CIFAR10DataModule",
    "data.batch_size": 32,
    "optimizer": "Adam",
    "optimizer.lr": 1e-3,
    "trainer.accelerator": "cpu",
    "trainer.devices": 1,
    "trainer.max_epochs": 1,
    "logger.name": "tutorial",
}


@pytest.fixture
def as_sagemaker(tmp_path, monkeypatch):
    """hyperparameters dict → the argv the toolkit gives the program."""

    def convert(given: dict, encode=to_string) -> list[str]:
        """encode: SDK 2.x's Estimator uses to_string (str()), SDK 3.x and the framework estimators JSON."""
        path = tmp_path / "hyperparameters.json"
        path.write_text(json.dumps({k: encode(v) for k, v in given.items()}))  # what the SDK sends
        monkeypatch.setattr(environment, "hyperparameters_file_dir", str(path))
        argv = mapping.to_cmd_args(environment.read_hyperparameters())  # what the toolkit runs the script with
        return hyperparameters.merge(
            argv, hyperparameters.projects(hyperparameters.sent({"SM_INPUT_CONFIG_DIR": str(tmp_path)}))
        )

    return convert


def build(argv):
    return train.main(argv, run=False)


def test_krasser_part1_hyperparameters_work_unchanged(as_sagemaker, archive_dir, tmp_path):
    # the test's own settings beside the tutorial's: two steps of a small network in fp32 (the tutorial's resnet18 in the
    # machine's bf16 took 3 s a step on 2 cores here: the test was 31 s of the unit tier's 126 in CI)
    short = {"trainer.limit_train_batches": 2, "trainer.limit_val_batches": 1, "trainer.num_sanity_val_steps": 0}
    given = {**KRASSER_PART1, **short, "trainer.precision": "32-true", "model.arch": "mobilenet_v3_small"}
    cli = build(as_sagemaker({**given, "data.data_dir": archive_dir, "logger.save_dir": str(tmp_path)}))
    assert isinstance(cli.datamodule, CIFAR10DataModule) and cli.datamodule.batch_size == 32
    assert cli.trainer.max_epochs == 1 and cli.trainer.num_devices == 1
    assert cli.trainer.logger.name == "tutorial"
    cli.trainer.fit(cli.model, cli.datamodule)  # 2 steps of 32
    (optimizer,), (schedule,) = cli.trainer.optimizers, cli.trainer.lr_scheduler_configs
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.defaults["lr"] == 1e-3
    # trainer.yaml's schedule, over Adam's rate as the peak, stepped after each of the 2 optimizer steps
    assert schedule.interval == "step" and schedule.scheduler.base_lrs == [1e-3]
    assert schedule.scheduler.last_epoch == cli.trainer.global_step == 2


def test_default_is_the_device_pipeline_and_the_dataloader_one_keeps_earlier_settings(archive_dir):
    cli = build(["--data.data_dir", archive_dir])
    assert type(cli.datamodule) is DeviceCIFAR10DataModule and cli.datamodule.batch_size == 128
    assert cli.model.hparams.channels_last is True and cli.precision.chosen  # precision: the machine's (test_precision)
    # SageMaker's data_dir comes before the hyperparameters: picking the other class must not drop it
    cli = build(["--data.data_dir", archive_dir, "--data", "CIFAR10DataModule", "--data.num_workers", "1"])
    assert type(cli.datamodule) is CIFAR10DataModule and cli.datamodule.data_dir == archive_dir
    assert cli.datamodule.num_workers == 1 and cli.datamodule.batch_size == 128


def test_booleans_and_none_as_sagemaker_delivers_them(as_sagemaker, archive_dir):
    argv = as_sagemaker(
        {
            "data.data_dir": archive_dir,
            "trainer.enable_progress_bar": False,
            "model.cifar_stem": False,
            "data.download": True,
            "trainer.max_time": None,
            "checkpoint.monitor": None,
        }
    )
    assert "--trainer.enable_progress_bar=false" in argv and "--trainer.max_time=null" in argv
    config = build(argv).config
    assert config.trainer.enable_progress_bar is False
    assert config.model.cifar_stem is False and config.data.init_args.download is True
    assert config.trainer.max_time is None and config.checkpoint.monitor is None


@pytest.mark.parametrize("encode", [to_string, json.dumps], ids=["str", "json"])
def test_dicts_and_lists_as_either_sdk_sends_them(as_sagemaker, archive_dir, encode):
    """JSON dicts leave the toolkit as k=v,k2=v2 and str() ones as Python's repr: both reach the parser as mappings."""
    argv = as_sagemaker(
        {
            "data.data_dir": archive_dir,
            "optimizer": "Adam",
            "optimizer.init_args": {"lr": 0.2, "eps": 0.01},
            "optimizer.betas": [0.8, 0.9],
        },
        encode=encode,
    )
    init_args = build(argv).config.optimizer.init_args
    assert (init_args.lr, init_args.eps, tuple(init_args.betas)) == (0.2, 0.01, (0.8, 0.9))


def test_compile_takes_true_or_a_torch_compile_mode(as_sagemaker, archive_dir):
    """model.compile as SageMaker delivers it: true, or a mode (reduce-overhead: CUDA graphs on a GPU) kept as given."""
    for given in (True, "reduce-overhead"):
        cli = build(as_sagemaker({"data.data_dir": archive_dir, "model.compile": given}))
        assert cli.config.model.compile == given and cli.model.net._compiled_call_impl is not None


def test_num_classes_is_linked_from_the_data_module(archive_dir):
    cli = build(["--data.data_dir", archive_dir, "--data.num_classes", "7"])
    assert cli.model.hparams.num_classes == 7 and cli.model.net.fc.out_features == 7


@pytest.mark.parametrize(
    "given, message",
    [
        ({"trainer.max_epochz": 1}, "unrecognized arguments: --trainer.max_epochz=1"),
        ({"data.batch_size": "abc"}, "data.batch_size=abc is not valid (expected int)"),
        ({"data.num_workers": 2}, "data.num_workers is not accepted by device_data.DeviceCIFAR10DataModule"),
        ({"optimizer": "NoSuchOptimizer"}, "optimizer=NoSuchOptimizer is not valid"),
        ({"trainer.accelerator": "gpu"}, "trainer.accelerator=gpu asks for a GPU but this instance has none"),
        # Lightning's own reason, not the GPU line, though it names GPUs: the accelerator is the CPU, as asked (FSDP1's
        # registry name; `fsdp` itself is the runtime's FSDP2, which takes the CPU)
        (
            {"trainer.strategy": "fsdp_cpu_offload", "trainer.accelerator": "cpu"},
            "bad configuration: The strategy `fsdp` requires a GPU accelerator",
        ),
        ({"data.batch_size": -4}, "data.batch_size=-4 is not a batch size"),
        ({"data": "CIFAR10DataModule", "data.batch_size": 0}, "data.batch_size=0 is not a batch size"),
        (
            {"model.compile": "fast"},
            "model.compile=fast is not valid (expected bool or one of 'reduce-overhead', 'max-autotune')",
        ),
        ({"model.arch": "resnet1000"}, "model.arch='resnet1000' is not a torchvision classification model"),
        # nested, as SDK 3.x's driver needs them: the same one line
        ({"trainer": {"max_epochz": 1}}, "bad hyperparameter: trainer.max_epochz is not an option"),
        ({"trainer": {"max_epochs": "x"}}, "bad hyperparameter: trainer.max_epochs=x is not valid (expected int)"),
        (
            {"data": {"init_args": {"batch_size": "abc"}}},
            "bad hyperparameter: data.batch_size=abc is not valid (expected int)",
        ),
        ({"seed_everything": {"a": 1}}, "bad hyperparameter: seed_everything={'a': 1} is not valid"),  # not a group
        ({"dist_timeout": "ten"}, "bad hyperparameter: dist_timeout=ten is not valid (expected int)"),
        ({"dist_timeout": 0}, "dist_timeout=0 must be a positive number of seconds"),
        ({"dist_timeout": -5}, "dist_timeout=-5 must be a positive number of seconds"),
        ({"dist_timeout": 10**14}, f"dist_timeout={10**14} must be a positive number of seconds, at most 2419200"),
        ({"last_checkpoint_every_n_steps": -1}, "last_checkpoint_every_n_steps=-1 is not a number of steps"),
        ({"training_timeout": 0}, "training_timeout=0 is not valid"),
        ({"training_timeout": -5}, "training_timeout=-5 is not valid"),
        ({"preflight": "bogus"}, "preflight=bogus is not valid (expected one of 'warn', 'fail', 'off')"),
        ({"model.arch": "vit_b_16"}, "model.arch='vit_b_16' cannot take the data's 32×32 images (Wrong image height!"),
        ({"model.arch": "inception_v3"}, "model.arch='inception_v3' cannot take the data's 32×32 images ("),
        (  # tracking's URI as a hyperparameter (tracking/uri.py): checked before the trainer is made
            {"mlflow.tracking_uri": "arn:aws:sagemaker:us-east-1:1234:mlflow-app/x"},
            "arn:aws:sagemaker:us-east-1:1234:mlflow-app/x is not a SageMaker MLflow ARN",
        ),
    ],
)
def test_bad_hyperparameters_fail_in_one_line(
    as_sagemaker, on_sagemaker, as_script, archive_dir, tmp_path, capsys, given, message
):
    with pytest.raises(SystemExit) as exit:
        as_script(train.main, as_sagemaker({"data.data_dir": archive_dir, **given}))
    assert exit.value.code == 1
    err_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert len(err_lines) == 1 and message in err_lines[0]
    failure = (tmp_path / "failure").read_text()
    assert failure.count("\n") == 1 and message in failure


def test_one_process_trains_unwrapped_by_ddp(archive_dir, tmp_path):
    """strategy ddp with one process: DDP's timeout and cluster settings, but no DistributedDataParallel wrapper (with
    no other rank it only adds bucket copies, buffer broadcasts and all-reduces to every step: issue 13)."""
    seen = []

    class Look(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(trainer.strategy.model)

    cli = build(
        ["--data.data_dir", archive_dir, "--trainer.accelerator", "cpu", "--trainer.devices", "1"]
        + ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--data.batch_size", "16"]
        + ["--trainer.precision", "32-true", "--model.arch", "mobilenet_v3_small", "--logger.save_dir", str(tmp_path)]
    )
    cli.trainer.callbacks.append(Look())
    assert isinstance(cli.trainer.strategy, DDPStrategy) and cli.trainer.strategy._timeout.total_seconds() == 600
    cli.trainer.fit(cli.model, cli.datamodule)
    assert seen == [cli.model]


def test_help_groups_the_runtimes_settings_and_says_what_sagemaker_fills_in(capsys):
    with pytest.raises(SystemExit) as exit:
        train.main(["fit", "--help"])
    assert exit.value.code == 0
    help = " ".join(capsys.readouterr().out.split())
    group = help[help.index("sagemaker-lightning (the runtime's settings):") :]
    assert "On SageMaker the job fills in checkpoint.dirpath" in group and "the training channel" in group
    for key in ("--model_dir", "--last_checkpoint_every_n_steps", "--dist_timeout", "--preflight_min_busbw"):
        assert key in group
    assert "80 percent of the published figure" in group and "%%" not in help


def test_on_sagemaker_the_projects_own_model_checkpoint_gets_the_jobs_directory(on_sagemaker, tmp_path, monkeypatch):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI

    monkeypatch.setitem(os.environ, "SAGEMAKER_BASE_DIR", str(tmp_path))  # checkpoints: tmp_path/checkpoints
    own = ModelCheckpoint(monitor="loss")
    settings = ["--trainer.accelerator=cpu", "--trainer.logger=false"]
    cli = LightningCLI(BoringModel, args=settings, run=False, trainer_defaults={"callbacks": [own]})
    assert [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)] == [own]
    assert own.dirpath == str(tmp_path / "checkpoints")  # the directory SageMaker syncs, which a restart resumes from


def test_in_a_job_one_callback_calls_the_runtimes_work_at_every_step(on_sagemaker, tmp_path, monkeypatch):
    """Lightning calls none of the runtime's callbacks at a training step: Steps, the last callback, calls their work,
    in the hub's order; LastCheckpoint's and Goodput's after every checkpoint callback's save."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI
    from sagemaker_lightning.toolbox.concern import CallbackOrder, Steps

    monkeypatch.setitem(os.environ, "SAGEMAKER_BASE_DIR", str(tmp_path))
    cli = LightningCLI(BoringModel, args=["--trainer.accelerator=cpu", "--trainer.logger=false"], run=False)
    (order,) = [c for c in cli.trainer.callbacks if isinstance(c, CallbackOrder)]
    order.setup(cli.trainer, cli.model, "fit")  # the after_checkpoints last, as when a fit sets up
    *others, steps = cli.trainer.callbacks
    assert isinstance(steps, Steps) and type(others[-3]).__name__ == "ModelCheckpoint"
    working = ["LogLines", "StreamingEpochs", "TrainingLoader", "Watchdog", "LastCheckpoint", "Goodput"]
    assert [type(c).__name__ for c in steps.callbacks] == working
    runtimes = [c for c in others if type(c).__module__.startswith("sagemaker_lightning")]
    assert all(c.on_train_batch_start is None and c.on_train_batch_end is None for c in runtimes)


def test_a_bad_host_list_fails_in_one_line(as_script, tmp_path, monkeypatch, capsys):
    """The launch plan is made when the CLI starts, after its excepthook: a bad SM_HOSTS is the one line too."""
    job = {"SM_HOSTS": '["localhost","localhost"]', "SM_CURRENT_HOST": "localhost", "SM_OUTPUT_DIR": str(tmp_path)}
    monkeypatch.setattr(os, "environ", {**os.environ, **job})
    with pytest.raises(SystemExit) as exit:
        as_script(train.main, ["--trainer.max_epochs=1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1 and "names a host twice" in errors[0]
    assert "names a host twice" in (tmp_path / "failure").read_text()
