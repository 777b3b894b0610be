"""scripts/jobs/spec.py: the job that scripts/run_sagemaker.py's options describe, resolved and checked before the
SageMaker SDK is imported; a bad option fails in one line."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from jobs import options, spec
from sagemaker_lightning import lines
from sagemaker_lightning.lines import METRICS

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "run_sagemaker.py")
SOURCE = ["--source-dir", os.path.join(ROOT, "examples", "user_project")]  # a project with its train.py
PYTHON = {"v2": sys.executable, "v3": os.path.join(ROOT, ".venv-sdk3", "bin", "python")}
# `python scripts/run_sagemaker.py WORDS` (its folder first on sys.path), then whether the SageMaker SDK was imported
RUN = """
import os, runpy, sys
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(sys.argv[0])
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("sagemaker imported" if "sagemaker" in sys.modules else "sagemaker not imported")
"""
LOCAL = ["--image", "i", "--input", "d", "--output", "o"]
CLOUD = ["--image", "i", "--instance-type", "ml.g5.xlarge", "--role", "arn:aws:iam::1:role/r", "--input", "s3://b/in",
         "--output", "s3://b/out"]  # fmt: skip


def job(*words, installed="v2"):
    return spec.make_job(options.parse_args([*words]), installed)


def test_a_cloud_job_is_resolved_from_its_options():
    cloud = job(*CLOUD, "--launcher", "torchrun", "--env", "NCCL_DEBUG=INFO", "--tensorboard", "s3://b/tb", "--subnets",
                "s-1,s-2", "--security-groups", "g-1", "--tag", "a=b", "--distribution", "mpi", "trainer.max_epochs=2")  # fmt: skip
    assert (cloud.sdk, cloud.role, cloud.output, cloud.inputs) == (
        "v2",
        CLOUD[5],
        "s3://b/out",
        {"training": "s3://b/in"},
    )
    assert cloud.hyperparameters == {
        "trainer.max_epochs": "2",
        "logger.save_dir": "s3://b/tb",
        **spec.framework_hyperparameters("mpi", "ml.g5.xlarge", None),
    }
    assert cloud.environment == {"DATA_CHANNEL": "training", "LAUNCHER": "torchrun", "NCCL_DEBUG": "INFO"}
    assert (cloud.subnets, cloud.security_groups, cloud.tags) == (["s-1", "s-2"], ["g-1"], {"a": "b"})
    assert cloud.wait and not cloud.local and not job(*CLOUD, "--dry-run").wait and not job(*CLOUD, "--no-wait").wait
    with pytest.raises(dataclasses.FrozenInstanceError):
        cloud.role = "another"


@pytest.mark.parametrize("uri", ["http://10.0.0.5:5000", "arn:aws:sagemaker:us-east-1:111122223333:mlflow-app/app-1"])
def test_mlflow_goes_into_the_jobs_environment_as_aws_examples_pass_it(uri):
    """Both SDKs' adapters send job.environment as it is (tests/cloud/test_cloud_jobs.py checks the request)."""
    assert job(*CLOUD, "--mlflow", uri).environment["MLFLOW_TRACKING_URI"] == uri
    assert "MLFLOW_TRACKING_URI" not in job(*CLOUD).environment


@pytest.mark.parametrize("seconds", [0, 1800, 3600])
def test_keep_alive_is_resolved_within_sagemakers_range(seconds):
    assert job(*CLOUD, "--keep-alive", str(seconds)).keep_alive == seconds
    assert job(*CLOUD).keep_alive is None  # none asked: SageMaker keeps no warm pool
    with pytest.raises(SystemExit, match="--keep-alive is for cloud jobs on demand: local mode keeps no instance"):
        job(*LOCAL, "--keep-alive", str(seconds))


def test_a_local_job_gets_the_dummy_role_and_its_own_tensorboard_setting():
    local = job(*LOCAL, "--tensorboard", "s3://b/tb", "logger.save_dir=mine")
    assert local.local and local.role == spec.LOCAL_ROLE and local.output == f"file://{os.path.abspath('o')}"
    assert local.hyperparameters == {"logger.save_dir": "mine"}


def test_the_sdk_is_the_installed_one_unless_named():
    assert job(*LOCAL, installed="v3").sdk == "v3"
    with pytest.raises(SystemExit, match=r"--sdk v2 needs SageMaker SDK 2\.x, but 3\.x is installed here; run \.venv/"):
        job("--sdk", "v2", *LOCAL, installed="v3")


@pytest.mark.parametrize(
    "words, message",
    [
        ([*LOCAL, "--dry-run"], "--dry-run and --spot are for cloud jobs"),
        ([*LOCAL[:-1], "s3://b/out"], "SDK 3.x local mode writes its artifacts to a local --output directory"),
        ([*LOCAL, *SOURCE, "--distribution", "mpi"], "SDK 3.x runs --source-dir code with --distribution none or "
         "torch_distributed, not mpi"),
        ([*CLOUD, *SOURCE, "--distribution", "pytorchddp"], "--distribution none or torch_distributed, not pytorchddp"),
    ],
)  # fmt: skip
def test_sdk3_s_own_rules_are_checked_with_the_others(words, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        job(*words, installed="v3")


def test_what_sdk3_refuses_sdk2_runs():
    assert job(*LOCAL[:-1], "s3://b/out").output == "s3://b/out"
    assert job(*LOCAL, *SOURCE, "--distribution", "mpi").distribution == "mpi"
    assert job(*LOCAL, *SOURCE, "--distribution", "torch_distributed", installed="v3").source_dir == SOURCE[1]


@pytest.mark.parametrize(
    "sdk, words, message",
    [
        ("v2", [a for a in CLOUD if not a.startswith(("--role", "arn:"))], "a cloud job needs --role"),
        ("v2", [*CLOUD, "--tag", "oops"], "'oops' is not key=value, e.g. project=cifar10"),
        ("v2", ["--sdk", "v3", *LOCAL], "--sdk v3 needs SageMaker SDK 3.x, but 2.x is installed here"),
        ("v3", [*LOCAL[:-1], "s3://b/out"], "SDK 3.x local mode writes its artifacts to a local --output directory"),
        ("v2", [*CLOUD, "--mlflow", "mlflow.internal:5000"], "--mlflow: the MLflow tracking URI mlflow.internal:5000 "),
        ("v3", [*CLOUD, "--mlflow", "arn:aws:sagemaker:us-east-1:1:mlflow-app/a"], "--mlflow: the MLflow tracking URI"),
        ("v2", [*CLOUD, "--mlflow", "http://m:5000", "--network-isolation"], "--mlflow needs the network"),
        ("v2", [*CLOUD, "--keep-alive", "3601"], "--keep-alive 3601 is outside SageMaker's range: give 0 to 3600"),
        ("v3", [*CLOUD, "--keep-alive", "-1"], "--keep-alive -1 is outside SageMaker's range: give 0 to 3600"),
        ("v2", [*CLOUD, "--spot", "--keep-alive", "60"], "--keep-alive is for cloud jobs on demand"),
    ],
)
def test_a_bad_option_fails_in_one_line_before_the_sdk_is_imported(sdk, words, message, tmp_path):
    run = subprocess.run(
        [PYTHON[sdk], "-c", RUN, SCRIPT, *words], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and run.stdout == "sagemaker not imported\n", run.stdout + run.stderr
    assert run.stderr.startswith(f"error: {message}") and run.stderr.count("\n") == 1, run.stderr
    assert not os.listdir(tmp_path)  # nothing made: no output or checkpoint folder


def test_the_command_finds_its_parts_from_any_working_directory(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "Start a training job on the image" in run.stdout, run.stderr


def test_a_projects_own_metrics_join_the_runtimes():
    number = r"loss=^loss=(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|-?[0-9.]+)(?= )"  # a number in any form SageMaker reads
    given = job(*CLOUD, "--metric", "val/f1", "--metric", "throughput=tokens/s=([0-9.]+)", "--metric", number)
    assert given.name.startswith("lightning-")  # not the last metric's name (it was: "throughput")
    metrics = given.metrics
    assert metrics["validation:f1"] == r"val/f1=(-?[0-9.]+)" and metrics["throughput"] == r"tokens/s=([0-9.]+)"
    assert set(METRICS) < set(metrics)  # the runtime's stay
    line = lines.validation(0, 5, {"val/f1": -0.25, "val/loss": 1.0})  # what the trainer prints, as it prints it
    assert re.search(metrics["validation:f1"], line)[1] == "-0.2500"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("train/acc", "'train/acc' is not a metric the validation line prints; log it as val/<name>"),
        ("broken=([0-9", "--metric broken=([0-9: unterminated character set"),
        ("loss=loss=[0-9.]+", "--metric loss=loss=[0-9.]+: its regex captures nothing; SageMaker reads the value"),
        (r"loss=loss=(\S+)", r"--metric loss=loss=(\S+): its first group can capture text; SageMaker reads a number"),
        ("loss=(loss)=([0-9.]+)", "--metric loss=(loss)=([0-9.]+): its first group can capture text"),
    ],
)
def test_a_metric_the_logs_do_not_show_fails_in_one_line(given, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        job(*CLOUD, "--metric", given)


def test_the_docs_list_every_metric_the_launcher_sends():
    with open(os.path.join(ROOT, "docs", "cloud.md")) as f:
        cloud = f.read()
    for name, regex in METRICS.items():
        assert f"| `{name}` | `{regex}` |" in cloud


def test_fastfile_is_asked_for_in_the_cloud_and_said_to_be_file_in_local_mode(monkeypatch, capsys):
    """--input-mode FastFile: the cloud job's channels are FastFile (tests/cloud/test_cloud_jobs.py: the request);
    local mode has File only, and the command says so in one line before the job starts."""
    assert job(*CLOUD).channel_input_mode == "File"
    assert job(*CLOUD, "--input-mode", "FastFile").channel_input_mode == "FastFile"
    local = job(*LOCAL, "--input-mode", "FastFile")
    assert (local.input_mode, local.channel_input_mode) == ("FastFile", "File")
    import run_sagemaker

    started = []
    monkeypatch.setattr(run_sagemaker.sdk2, "run", lambda j: started.append(j.channel_input_mode))
    assert run_sagemaker.main([*LOCAL, "--input-mode", "FastFile", "--sdk", "v2"]) == 0
    assert started == ["File"]
    assert capsys.readouterr().err == f"note: {spec.LOCAL_FASTFILE}\n"
    run_sagemaker.main([*LOCAL, "--sdk", "v2"])
    assert capsys.readouterr().err == ""
