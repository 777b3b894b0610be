"""A user's own project (examples/user_project) in the image, brought the SageMaker way: SDK 2.x's Estimator(source_dir,
entry_point) and SDK 3.x's ModelTrainer(source_code=SourceCode(...)) through scripts/run_sagemaker.py, in real local
mode on 2 hosts; and the cloud's code path, sagemaker_submit_directory on S3 (moto), in the image as SageMaker runs it.

The one-line project (train.py: the runtime's LightningCLI) and the plain script (plain.py: Lightning's Trainer,
unchanged) both train one model on both hosts: world size 2, the same final weights on each."""

import glob
import io
import json
import os
import re
import subprocess
import tarfile

import boto3
import pytest
import torch
from job_lines import ranks

pytestmark = pytest.mark.container

USER_WEIGHTS = {"net.0.weight": (8, 2), "net.0.bias": (8,), "net.2.weight": (3, 8), "net.2.bias": (3,)}


def members(tar_path: str) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def weights(model_pt: bytes) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in torch.load(io.BytesIO(model_pt), weights_only=True).items()}


DOTTED = ["trainer.max_epochs=2", "model.hidden=8", "data.batch_size=16", "trainer.enable_progress_bar=False"]
NESTED = ['trainer={"max_epochs": 2, "enable_progress_bar": false}', 'model={"hidden": 8}', 'data={"batch_size": 16}']
RUNS = {  # name: (SDK, run_sagemaker.py options, settings)
    "SDK 2.x, dotted": ("v2", [], DOTTED),
    "SDK 2.x, nested": ("v2", [], NESTED),
    "SDK 3.x, dotted (nested by run_sagemaker.py)": ("v3", [], DOTTED),
    "SDK 3.x, Torchrun()": ("v3", ["--distribution", "torch_distributed"], NESTED),
}


@pytest.mark.parametrize("name", RUNS)
def test_one_line_project_on_two_hosts(local_job, user_project, points_dir, name):
    """The same settings, dotted or nested, on both SDKs and with SDK 3.x's torchrun driver; a data module whose
    directory argument is `root`; the settings in force in config.yaml of model.tar.gz."""
    sdk, options, settings = RUNS[name]
    code, output, runs = local_job(2, points_dir, "--source-dir", user_project, *options, *settings, sdk=sdk)
    assert code == 0, output[-5000:]
    found = ranks(output)
    assert sorted((r, closed.world) for r, closed in found.items()) == [(0, 2), (1, 2)], output[-5000:]
    assert len({closed.digest for closed in found.values()}) == 1  # both hosts end with the same weights
    (tar_path,) = re.findall(r"^model\.tar\.gz: (\S+)$", output, re.M)
    files = members(tar_path)
    assert weights(files["model.pt"]) == USER_WEIGHTS
    config = files["config.yaml"].decode()
    assert "max_epochs: 2" in config and "hidden: 8" in config and "root: /opt/ml/input/data/training" in config


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_plain_script_unchanged_on_two_hosts(local_job, user_project, points_dir, sdk):
    """Lightning's own Trainer() with no num_nodes: one job of world size 2 all the same, and what it writes under
    its default root (lightning_logs/, its checkpoints) is in the job's output.tar.gz."""
    code, output, runs = local_job(
        2, points_dir, "--source-dir", user_project, "--entry-point", "plain.py", "epochs=1", sdk=sdk
    )
    assert code == 0, output[-5000:]
    found = re.findall(r"\|\s*plain rank (\d+)/(\d+): weights (\w+)", output)
    assert sorted((int(r), int(w)) for r, w, _ in found) == [(0, 2), (1, 2)], output[-5000:]
    assert len({digest for *_, digest in found}) == 1
    outputs = glob.glob(str(runs / "**" / "output.tar.gz"), recursive=True)
    names = [name for path in outputs for name in members(path)]
    assert any(re.match(r"(data/)?lightning_logs/version_\d+/checkpoints/epoch=0-step=\d+\.ckpt$", n) for n in names), (
        names
    )


def test_code_from_s3_runs_instead_of_the_example(image, user_project, points_dir, aws, tmp_path):
    """The cloud's way: the toolkit downloads sourcedir.tar.gz from sagemaker_submit_directory and extracts it into
    /opt/ml/code, which the image leaves empty: the user's code trains, not the example (moto stands in for S3)."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="code")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(user_project, arcname=".")
    s3.put_object(Bucket="code", Key="job/source/sourcedir.tar.gz", Body=archive.getvalue())
    config, model, output = (tmp_path / d for d in ("config", "model", "output"))
    for d in (config, model, output):
        d.mkdir()
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (config / "inputdataconfig.json").write_text(json.dumps({"training": {"TrainingInputMode": "File"}}))
    hyperparameters = {"sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://code/job/source/sourcedir.tar.gz",
                       "trainer": {"max_epochs": 1}, "model.hidden": 8, "dist_timeout": 30}  # fmt: skip
    (config / "hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hyperparameters.items()}))
    mounts = {
        "/opt/ml/input/config": config,
        "/opt/ml/input/data/training": points_dir,
        "/opt/ml/model": model,
        "/opt/ml/output": output,
    }
    command = ["docker", "run", "--rm", "--network", "host", "--add-host", "algo-1:127.0.0.1"]
    command += [arg for target, source in mounts.items() for arg in ("-v", f"{source}:{target}")]
    command += [arg for key, value in aws.items() for arg in ("-e", f"{key}={value}")]
    run = subprocess.run([*command, image, "train"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Successfully installed tinyhelper-0.1" in run.stdout + run.stderr  # its requirements.txt, from S3
    with open(model / "model.pt", "rb") as f:
        assert weights(f.read()) == USER_WEIGHTS  # the user's model, not the example's ResNet
    assert not os.path.exists(output / "failure")
