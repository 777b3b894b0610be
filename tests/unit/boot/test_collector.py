"""The collector while a training program starts (boot/collector.py): the start-up hook makes its collections rare in
the program SageMaker starts, and only there; the runtime's LightningCLI, its classes built, freezes start-up's
objects and gives Python its thresholds back.

    .venv/bin/pytest tests/unit/boot/test_collector.py
"""

import gc
import os
import subprocess
import sys

import pytest

from sagemaker_lightning.boot import collector, signals

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv, program, expected",
    [
        (["train.py", "--trainer.max_epochs", "1"], "train.py", True),  # the toolkit's `python train.py`
        (["/opt/ml/code/train.py"], "train.py", True),  # torchrun's and mpirun's ranks: the script's path
        (["/opt/ml/code/train.py"], "src/train.py", True),  # SAGEMAKER_PROGRAM under source_dir's folder
        (["/opt/conda/bin/torchrun", "train.py"], "train.py", False),  # a launcher
        (["-c"], "train.py", False),  # python -c: pip's helpers, the toolkit's probes
        (["-m"], "train.py", False),
        (["train.py"], "", False),  # no program named: nothing is paused
        (["train.py"], None, False),
        ([], "train.py", False),  # an embedded interpreter
    ],
)
def test_only_the_program_sagemaker_starts_is_paused(argv, program, expected):
    env = {} if program is None else {"SAGEMAKER_PROGRAM": program}
    assert collector.training_program(argv, env) is expected


def test_the_start_up_hook_pauses_the_program_and_nothing_else(tmp_path):
    """The hook (what the image's .pth file imports first) on a SageMaker host: the program's collections are rare; a
    script of another name keeps Python's."""
    script = "import gc, sagemaker_lightning.boot.autoenv; print(*gc.get_threshold())\n"
    for name in ("train.py", "other.py"):
        (tmp_path / name).write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join(sys.path),
        "SM_HOSTS": '["algo-1"]',
        "SM_CURRENT_HOST": "algo-1",
        "SAGEMAKER_BASE_DIR": str(tmp_path),
        "SAGEMAKER_PROGRAM": "train.py",
    }
    said = {
        name: subprocess.run([sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True)
        for name in ("train.py", "other.py")
    }
    assert said["train.py"].stdout.split()[0] == str(collector.STARTING), said["train.py"].stderr
    assert said["other.py"].stdout.split() == [str(t) for t in collector.PYTHONS], said["other.py"].stderr


def test_the_runtimes_cli_freezes_start_up_and_gives_python_its_collector_back(tmp_path, monkeypatch):
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI

    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SAGEMAKER_BASE_DIR": str(tmp_path)}
    monkeypatch.setattr(os, "environ", {**os.environ, **job, "SM_OUTPUT_DIR": str(tmp_path)})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    collector.pause()
    try:
        frozen = gc.get_freeze_count()
        LightningCLI(BoringModel, args=["--trainer.accelerator=cpu", "--trainer.logger=false"], run=False)
        assert gc.get_threshold() == collector.PYTHONS
        assert gc.get_freeze_count() > frozen  # start-up's objects, and the model's, out of the collector's scans
    finally:
        gc.set_threshold(*collector.PYTHONS)
