"""The warm pool's cache folder in the image (app/sagemaker_lightning/boot/warmpool.py): two runs of a job that brings its
own code with a requirements.txt naming a package index (a local one, made here), the same folder mounted at
/opt/ml/sagemaker/warmpoolcache in both, as SageMaker keeps it on a warm pool's instance. The first, with the
network, gets its code from S3 as in the cloud (sagemaker_submit_directory on moto's S3: PID 1 fetches it before the
toolkit), installs from the index and keeps the wheels there; the second, its code mounted as in local mode, runs
with no network at all and installs them from the cache. A job without the folder says so in one line and installs
as before (every other test of the tier)."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import boto3
import pytest

pytestmark = pytest.mark.container

CACHE = "/opt/ml/sagemaker/warmpoolcache"


def test_the_second_job_installs_its_requirements_from_the_cache_with_no_network(
    image, user_project, points_dir, aws, tmp_path, free_port, wait_until_up
):
    port = free_port()
    index = tmp_path / "index" / "tinyhelper"  # a "simple" index: a page per project listing its files (a folder's)
    shutil.copytree(os.path.join(user_project, "wheels"), index)  # the project's dependency, now on an index
    code = tmp_path / "code"
    shutil.copytree(user_project, code, ignore=shutil.ignore_patterns("wheels"))
    (code / "requirements.txt").write_text(f"--index-url http://127.0.0.1:{port}/\ntinyhelper==0.1\n")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(code, arcname=".")
    boto3.client("s3").create_bucket(Bucket="code")
    boto3.client("s3").put_object(Bucket="code", Key="job/sourcedir.tar.gz", Body=archive.getvalue())
    cache = tmp_path / "warmpoolcache"
    cache.mkdir()
    hyperparameters = {"sagemaker_program": "train.py", "trainer": {"max_epochs": 1, "limit_train_batches": 2},
                       "model.hidden": 8, "dist_timeout": 30}  # fmt: skip

    def job(network: str, code_from: dict) -> subprocess.CompletedProcess:
        config = tmp_path / f"config-{network}"
        config.mkdir()
        (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
        (config / "inputdataconfig.json").write_text(json.dumps({"training": {"TrainingInputMode": "File"}}))
        given = {**hyperparameters, **code_from.get("hyperparameters", {})}
        (config / "hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in given.items()}))
        mounts = {"/opt/ml/input/config": config, "/opt/ml/input/data/training": points_dir, CACHE: cache,
                  **code_from.get("mounts", {})}  # fmt: skip
        command = ["docker", "run", "--rm", "--network", network, "--add-host", "algo-1:127.0.0.1"]
        command += [arg for target, source in mounts.items() for arg in ("-v", f"{source}:{target}")]
        command += [arg for key, value in aws.items() for arg in ("-e", f"{key}={value}")]
        run = subprocess.run([*command, image, "train"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run

    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=index.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}/tinyhelper/", 30)
        first = job("host", {"hyperparameters": {"sagemaker_submit_directory": "s3://code/job/sourcedir.tar.gz"}})
    finally:
        server.terminate()
        server.wait()
    output = first.stdout + first.stderr
    assert f"entrypoint: warm-pool cache {CACHE}: pip's, uv's, torch.compile's and streaming data's caches" in output
    assert "Successfully installed tinyhelper-0.1" in output
    assert "entrypoint: requirements.txt installed, its 1 wheels kept in the warm-pool cache" in output
    assert {"pip", "torchinductor", "streaming", "wheels"} <= set(os.listdir(cache))

    second = job("none", {"mounts": {"/opt/ml/code": code}})  # no network: neither the index nor S3
    output = second.stdout + second.stderr
    assert "entrypoint: requirements.txt installed from the warm-pool cache" in output, output[-3000:]
    assert "Successfully installed tinyhelper-0.1" in output
    assert "Requirement already satisfied: tinyhelper==0.1" in output  # the toolkit's own install, after PID 1's
