"""A user's own script as a job runs it, in a process of its own with SageMaker's variables: the runtime's LightningCLI
with run=False, fit, then what Lightning promises after a fit (trainer.save_checkpoint: the file is there when it
returns, a failure raises; no thread of the trainer's left behind); goodput's ledger, bookkeeping that never ends
training: a folder in its place (every write fails), then, for a second fit that resumes, a ledger planted with a
mistyped figure. One run of the script for every test here (its fits take seconds; its imports most of them).

    .venv/bin/pytest tests/toolkit/test_users_script.py
"""

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.toolkit

SCRIPT = """
import json, os, threading, time
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from sagemaker_lightning import LightningCLI

save = torch.save
def slow(*args, **kwargs):  # a disk slower than a step: a write in the background is not there yet when it returns
    time.sleep(0.5)
    return save(*args, **kwargs)
torch.save = slow

def writers():
    return [t.name for t in threading.enumerate() if t.name.startswith(("checkpoint-writer", "goodput-ledger"))]

found = {}
os.makedirs("ckpts/goodput.json")  # a folder where goodput's ledger goes: every write of it fails
args = ["--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.logger=false", "--checkpoint.dirpath=ckpts"]
args += ["--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
cli = LightningCLI(BoringModel, args=args, run=False, save_config_callback=None)
cli.trainer.fit(cli.model)
found["writers after the fit"] = writers()
cli.trainer.save_checkpoint("final.ckpt")
found["there when it returned"] = os.path.exists("final.ckpt")
try:
    found["loaded step"] = torch.load("final.ckpt", weights_only=True)["global_step"]
except OSError as e:
    found["loaded step"] = type(e).__name__
open("a-file", "w").close()
try:
    cli.trainer.save_checkpoint("a-file/final.ckpt")
    found["a save into a file"] = "returned"
except OSError as e:
    found["a save into a file"] = type(e).__name__
found["writers at the end"] = writers()

# another fit resumes, with a ledger planted beside the checkpoints naming the checkpoint's own attempt, one figure
# mistyped
os.rmdir("ckpts/goodput.json")
record = torch.load("ckpts/last.ckpt", weights_only=True)["callbacks"]["Goodput"]["records"][-1]
with open("ckpts/goodput.json", "w") as f:
    json.dump({"records": [{**record, "wall": "12"}]}, f)
cli = LightningCLI(BoringModel, args=[*args, "--trainer.max_steps=4"], run=False, save_config_callback=None)
cli.trainer.fit(cli.model)
found["resumed and trained to step"] = cli.trainer.global_step
print("FOUND", json.dumps(found))
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """The script's run (one for every test here) and what it found."""
    where = tmp_path_factory.mktemp("script")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    env.update(SM_HOSTS='["localhost"]', SM_CURRENT_HOST="localhost", SM_NUM_GPUS="0", SM_OUTPUT_DIR=str(where))
    env.update(SAGEMAKER_BASE_DIR=str(where / "ml"), SAGEMAKER_LIGHTNING_RUN_DIR=str(where / "run"))
    (where / "script.py").write_text(SCRIPT)
    run = subprocess.run([sys.executable, "script.py"], cwd=where, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run, json.loads(run.stdout.split("FOUND ", 1)[1])


def test_a_save_after_the_fit_is_there_when_it_returns_its_failure_raises_and_no_writer_thread_is_left(script):
    assert {k: v for k, v in script[1].items() if not k.startswith("resumed")} == {
        "writers after the fit": [],
        "there when it returned": True,
        "loaded step": 2,
        "a save into a file": "FileExistsError",  # as Lightning's own writer raises it
        "writers at the end": [],
    }


def test_a_ledger_that_cannot_be_written_is_one_line_and_training_goes_on(script):
    said = [line for line in script[0].stdout.splitlines() if line.startswith("could not write")]
    assert len(said) == 1 and re.fullmatch(
        r"could not write goodput.s ledger .*ckpts/goodput\.json \(IsADirectoryError: .*\); .*retried.*", said[0]
    ), said
    assert re.search(r"^goodput [0-9.]+ %: training", script[0].stdout, re.M)  # the fit's end, as always


def test_a_planted_ledger_is_ignored_in_one_line_naming_it_and_the_job_trains_to_its_end(script):
    run, found = script
    assert found["resumed and trained to step"] == 4
    said = [line for line in run.stdout.splitlines() if line.startswith("ignored ")]
    assert len(said) == 1 and re.fullmatch(
        r"ignored goodput's ledger .*ckpts/goodput\.json: .*\(wall is \"12\"\).*", said[0]
    )
    assert len(re.findall(r"^goodput [0-9.]+ %: training", run.stdout, re.M)) == 2  # each fit's end
