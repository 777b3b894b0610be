"""Cloud jobs from scripts/run_sagemaker.py, through SDK 2.x and 3.x: the CreateTrainingJob request as --dry-run
prints it (every field), and what a real call leaves on the moto server (the fields moto keeps)."""

import json
import os
import re
import subprocess
import sys

import boto3
import pytest

pytestmark = pytest.mark.cloud
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = {"v2": sys.executable, "v3": os.path.join(ROOT, ".venv-sdk3", "bin", "python")}
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-lightning:abc1234"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
JOB = [
    "--image",
    IMAGE,
    "--instance-type",
    "ml.p4d.24xlarge",
    "--instance-count",
    "2",
    "--role",
    ROLE,
    "--input",
    "s3://cifar-data/cifar10",
    "--output",
    "s3://ml-jobs/jobs",
    "--job-name",
    "cifar",
    "--spot",
    "--max-run",
    "7200",
    "--max-wait",
    "10800",
    "--max-retry-attempts",
    "2",
    "--distribution",
    "torch_distributed",
    "--network-isolation",
    "--subnets",
    "subnet-1,subnet-2",
    "--security-groups",
    "sg-1",
    "--tag",
    "project=cifar10",
    "--tag",
    "owner=ml",
    "--env",
    "NCCL_DEBUG=INFO",
    "--tensorboard",
    "s3://ml-jobs/tensorboard",
    "trainer.max_epochs=30",
    "data.batch_size=256",
]


def launch(sdk: str, env: dict, *extra: str) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [PYTHON[sdk], os.path.join(ROOT, "scripts", "run_sagemaker.py"), *JOB, *extra],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_dry_run_prints_the_whole_request_and_sends_nothing(sdk, tmp_path):
    # no credentials and an endpoint that answers nothing: a dry run must not need either
    offline = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    request = json.loads(launch(sdk, offline, "--dry-run").stdout)
    name = request["TrainingJobName"]
    assert name.startswith("cifar-")
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    metrics = {m["Name"]: m["Regex"] for m in request["AlgorithmSpecification"]["MetricDefinitions"]}
    assert metrics == {  # what CloudWatch charts, read from the runtime's progress lines (RankReport)
        "train:loss": r"train/loss=([0-9.]+)",
        "train:images_per_second": r"images/s=([0-9.]+)",
        "validation:loss": r"val/loss=([0-9.]+)",
        "validation:accuracy": r"val/acc=([0-9.]+)",
        "hosts:slowest_ratio": r"hosts: slowest \S+ ([0-9.]+)x",  # the watchdog's stragglers (stragglers.py)
        "job:goodput_percent": r"goodput ([0-9.]+) %: training",  # the job's last line (goodput.py)
    }
    assert request["RoleArn"] == ROLE
    assert (
        request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
        and request["ResourceConfig"]["InstanceCount"] == 2
    )
    (channel,) = request["InputDataConfig"]
    assert (
        channel["ChannelName"] == "training"
        and channel["DataSource"]["S3DataSource"]["S3Uri"] == "s3://cifar-data/cifar10"
    )
    assert request["OutputDataConfig"]["S3OutputPath"] == "s3://ml-jobs/jobs"
    assert request["EnableManagedSpotTraining"] is True
    stop = request["StoppingCondition"]
    assert (stop["MaxRuntimeInSeconds"], stop["MaxWaitTimeInSeconds"]) == (7200, 10800)
    assert request["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    # under the output path, in the job's folder (SDK 3.x adds its own suffix to the name), ending in "/"
    folder = re.fullmatch(r"s3://ml-jobs/jobs/(cifar-\d{8}-\d{6})/checkpoints/", request["CheckpointConfig"]["S3Uri"])
    assert folder and name.startswith(folder[1]) and request["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    hps = request["HyperParameters"]
    assert hps["trainer.max_epochs"] == "30" and hps["data.batch_size"] == "256"
    assert hps["logger.save_dir"] == "s3://ml-jobs/tensorboard"
    assert json.loads(hps["sagemaker_torch_distributed_enabled"]) is True
    assert json.loads(hps["sagemaker_instance_type"]) == "ml.p4d.24xlarge"
    assert request["Environment"] == {"DATA_CHANNEL": "training", "NCCL_DEBUG": "INFO"}
    assert request["EnableNetworkIsolation"] is True
    assert request["VpcConfig"] == {"Subnets": ["subnet-1", "subnet-2"], "SecurityGroupIds": ["sg-1"]}
    assert {t["Key"]: t["Value"] for t in request["Tags"]} == {"project": "cifar10", "owner": "ml"}


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_create_training_job_on_the_moto_server(sdk, aws):
    # SDK 3.x checks the role with IAM's SimulatePrincipalPolicy, which moto does not implement
    launch(sdk, {**aws, "SAGEMAKER_VALIDATE_ROLE": "false"}, "--no-wait")
    sagemaker = boto3.client("sagemaker")
    (summary,) = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
    assert job["AlgorithmSpecification"]["TrainingImage"] == IMAGE and job["RoleArn"] == ROLE
    assert job["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge" and job["ResourceConfig"]["InstanceCount"] == 2
    assert job["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == "s3://cifar-data/cifar10"
    assert job["OutputDataConfig"]["S3OutputPath"] == "s3://ml-jobs/jobs"
    assert job["EnableManagedSpotTraining"] is True
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 10800}
    assert (
        job["CheckpointConfig"]["S3Uri"].endswith("/checkpoints/")
        and job["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    )
    assert job["HyperParameters"]["trainer.max_epochs"] == "30"
    assert json.loads(job["HyperParameters"]["sagemaker_torch_distributed_enabled"]) is True
    assert job["EnableNetworkIsolation"] is True
    assert job["VpcConfig"] == {"Subnets": ["subnet-1", "subnet-2"], "SecurityGroupIds": ["sg-1"]}
    tags = sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags} == {"project": "cifar10", "owner": "ml"}
    # moto keeps no Environment or RetryStrategy and its own MetricDefinitions: the dry-run test checks those


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_keep_alive_asks_for_a_warm_pool_on_the_moto_server(sdk, aws):
    """--keep-alive reaches ResourceConfig's KeepAlivePeriodInSeconds (SDK 2.x's keep_alive_period_in_seconds, 3.x's
    Compute); an on-demand job, as SageMaker keeps no warm pool of spot instances."""
    spot = {"--spot", "--max-wait", "10800"}
    on_demand = [word for word in JOB if word not in spot]
    run = subprocess.run(
        [
            PYTHON[sdk],
            os.path.join(ROOT, "scripts", "run_sagemaker.py"),
            *on_demand,
            "--keep-alive",
            "1800",
            "--no-wait",
        ],
        env={**os.environ, **aws, "SAGEMAKER_VALIDATE_ROLE": "false"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    sagemaker = boto3.client("sagemaker")
    (summary,) = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
    assert job["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert job["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge" and not job.get("EnableManagedSpotTraining")


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_dry_run_with_source_dir_uploads_nothing_and_needs_no_credentials(sdk, aws, user_project):
    """The SDK packs --source-dir and uploads it (SDK 2.x: beside the output; 3.x: its default bucket, found through
    STS): a dry run says where, and sends nothing."""
    offline = {
        "AWS_ENDPOINT_URL": aws["AWS_ENDPOINT_URL"],  # a server that would keep what reached it
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    run = launch(sdk, offline, "--dry-run", "--source-dir", user_project, "--entry-point", "train.py")
    request = json.loads(run.stdout)
    uploads = re.findall(r"^dry run: would upload (s3://\S+)$", run.stderr, re.M)
    where = {"v2": "s3://ml-jobs/cifar-", "v3": "s3://sagemaker-us-east-1-000000000000/cifar-"}[sdk]
    assert uploads and all(upload.startswith(where) for upload in uploads)
    # the code as a channel (SDK 3.x: file by file; 2.x with network isolation: the archive), else the archive's URI
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
    code = channels.get("code") or json.loads(request["HyperParameters"]["sagemaker_submit_directory"])
    assert any(upload.startswith(code) for upload in uploads)  # the request names where the code would be
    assert boto3.client("s3").list_buckets()["Buckets"] == []  # moto: nothing arrived


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_fastfile_channels_reach_the_request_on_both_sdks(sdk, aws):
    """--input-mode FastFile: the job's and the channel's input mode (SDK 3.x's InputData from a URI string would
    send a File channel whatever the job's mode: the channel is built with its own), in the dry run's request and on
    the moto server."""
    request = json.loads(launch(sdk, aws, "--input-mode", "FastFile", "--dry-run").stdout)
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    (channel,) = request["InputDataConfig"]
    assert (
        channel["InputMode"] == "FastFile"
        and channel["DataSource"]["S3DataSource"]["S3Uri"] == "s3://cifar-data/cifar10"
    )
    launch(sdk, {**aws, "SAGEMAKER_VALIDATE_ROLE": "false"}, "--input-mode", "FastFile", "--no-wait")
    sagemaker = boto3.client("sagemaker")
    (summary,) = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    job = sagemaker.describe_training_job(TrainingJobName=summary["TrainingJobName"])
    assert job["AlgorithmSpecification"]["TrainingInputMode"] == "FastFile"
    assert [c.get("InputMode", "FastFile") for c in job["InputDataConfig"]] == ["FastFile"]
