"""scripts/run_sagemaker.py: distributions as the framework hyperparameters SDK 2.x's PyTorch estimator sets."""

import json
import re
import sys
import tarfile

import pytest
from sagemaker.estimator import Estimator, EstimatorBase
from sagemaker.pytorch import PyTorch

import run_sagemaker
from jobs import options, outcome, sdk2, sdk3, spec
from jobs.watch import ValidationWatch

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "name, distribution",
    [
        ("torch_distributed", {"torch_distributed": {"enabled": True}}),
        ("pytorchddp", {"pytorchddp": {"enabled": True}}),
        ("smdistributed", {"smdistributed": {"dataparallel": {"enabled": True}}}),
        ("mpi", {"mpi": {"enabled": True, "processes_per_host": 4}}),
    ],
)
def test_distributions_match_the_sdks_pytorch_estimator(name, distribution):
    estimator = PyTorch(
        entry_point="launch.py",
        image_uri="123.dkr.ecr.us-east-1.amazonaws.com/x:1",
        role=spec.LOCAL_ROLE,
        instance_count=2,
        instance_type="ml.p4d.24xlarge",
        distribution=distribution,
    )
    expected = EstimatorBase._json_encode_hyperparameters(estimator._pytorch_distribution_configuration(distribution))
    processes = distribution.get("mpi", {}).get("processes_per_host")
    assert spec.framework_hyperparameters(name, "ml.p4d.24xlarge", processes) == expected


@pytest.mark.parametrize("source_dir", [None, "."])
def test_a_job_with_source_dir_sends_the_framework_hyperparameters_once_encoded(source_dir):
    """SDK 2.x encodes every value of a job with source_dir (before: '""' encoded twice, mpirun's program)."""
    sent = spec.framework_hyperparameters("mpi", "local", 2)
    estimator = Estimator(
        entry_point="train.py" if source_dir else None,
        source_dir=source_dir,
        image_uri="x:1",
        role=spec.LOCAL_ROLE,
        instance_count=1,
        instance_type="ml.c5.xlarge",
        hyperparameters=sdk2.estimator_hyperparameters({**sent, "trainer.max_epochs": "2"}, source_dir),
    )
    assert {k: v for k, v in estimator.hyperparameters().items() if k.startswith("sagemaker_")} == sent


def test_no_distribution_adds_nothing_but_a_process_count():
    assert spec.framework_hyperparameters("none", "local", None) == {}
    assert spec.framework_hyperparameters("none", "local", 2) == {"sagemaker_mpi_num_of_processes_per_host": "2"}


def test_key_value_words():
    assert spec.key_values(["a.b=1", "c=x=y", "d="], "a=1") == {"a.b": "1", "c": "x=y", "d": ""}
    with pytest.raises(SystemExit, match="'oops' is not key=value, e.g. a=1"):
        spec.key_values(["oops"], "a=1")


def test_the_other_sdk_is_named_with_its_venv(capsys):
    with pytest.raises(
        SystemExit, match="--sdk v3 needs SageMaker SDK 3.x, but 2.x is installed here; run .venv-sdk3/bin/python"
    ):
        run_sagemaker.main(["--sdk", "v3", "--image", "x", "--input", "d", "--output", "o"])
    assert json.loads(spec.framework_hyperparameters("mpi", "local", None)["sagemaker_mpi_enabled"]) is True


CLOUD = [
    "--image",
    "i",
    "--instance-type",
    "ml.g5.xlarge",
    "--role",
    "arn:aws:iam::1:role/r",
    "--input",
    "s3://b/in",
    "--output",
    "s3://b/out/",
]


def job(*words):
    return spec.make_job(options.parse_args([*words]))


def test_checkpoints_default_under_the_output_and_always_end_in_a_slash():
    assert job(*CLOUD).checkpoints == f"s3://b/out/{job(*CLOUD).name}/checkpoints/"
    assert job(*CLOUD, "--checkpoints", "s3://b/ckpt/run-1").checkpoints == "s3://b/ckpt/run-1/"


def test_spot_waits_at_least_as_long_as_it_runs():
    spot = job(*CLOUD, "--spot", "--max-run", "3600")
    assert (spot.max_wait, spot.max_retry_attempts) == (7200, 3)
    with pytest.raises(SystemExit, match="--max-wait 1800 is below --max-run 3600"):
        job(*CLOUD, "--spot", "--max-run", "3600", "--max-wait", "1800")


@pytest.mark.parametrize(
    "words, message",
    [
        (["--image", "i", "--input", "d", "--output", "o", "--spot"], "--dry-run and --spot are for cloud jobs"),
        (
            ["--image", "i", "--input", "d", "--output", "o", "--checkpoints", "s3://b/c"],
            "local mode keeps --checkpoints in a local directory",
        ),
        ([a for a in CLOUD if not a.startswith(("--role", "arn:"))], "a cloud job needs --role"),
        ([*CLOUD[:-2], "--output", "runs"], "a cloud job reads --input from and writes --output to s3:// URIs"),
        ([*CLOUD, "--tag", "oops"], "'oops' is not key=value, e.g. project=cifar10"),
    ],
)
def test_bad_job_options_are_named(words, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        job(*words)


def test_local_checkpoints_are_a_mounted_channel(tmp_path):
    local = job("--image", "i", "--input", "d", "--output", "o", "--checkpoints", str(tmp_path / "ck"))
    assert local.inputs["checkpoints"] == f"file://{tmp_path}/ck"
    assert local.hyperparameters["checkpoint.dirpath"] == spec.LOCAL_CHECKPOINTS and local.checkpoints is None


def test_dotted_settings_nest_for_sdk3_s_driver():
    words = ["trainer.max_epochs=3", "data.batch_size=32", "data=CIFAR10DataModule", "optimizer=Adam", "optimizer.lr=0.1",
             'trainer={"devices": 1}', "data.init_args.val_split=0.1", "model.arch=resnet18", "checkpoint.filename=a=b,c",
             "trainer.enable_progress_bar=False", "trainer.max_time=None"]  # fmt: skip
    assert sdk3.nested(spec.key_values(words, "")) == {
        "trainer": {"devices": 1, "max_epochs": 3, "enable_progress_bar": False, "max_time": None},
        "data": {"class_path": "CIFAR10DataModule", "init_args": {"batch_size": 32, "val_split": 0.1}},
        "optimizer": {"class_path": "Adam", "init_args": {"lr": 0.1}},
        "model": {"arch": "resnet18"},
        "checkpoint": {"filename": "a=b,c"},
    }


def test_an_entry_point_outside_the_source_dir_is_one_line(tmp_path):
    args = options.parse_args(["--image", "x", "--input", ".", "--output", ".", "--source-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=f"--entry-point train.py is not a file of --source-dir {tmp_path}"):
        spec.make_job(args)


def test_validation_watch_reads_the_accuracy_lines_as_they_pass(capsys):
    watch = ValidationWatch(sys.stdout)
    log = (
        "algo-1-abcde  | epoch 0 step 28: val/acc=0.5000 val/loss=1.2000\n"
        "algo-2-fghij  | rank 1/2 host algo-2: weights 0123 at step 84\n"
        "algo-1-abcde  | epoch 1 step 56: val/acc=0.9000 val/loss=0.3000\n"
        "\x1b[32m[algo-1] epoch 2 step 84: val/acc=0.8500 val/loss=0.4000\x1b[0m\n"  # the cloud log's colours
    )
    for start in range(0, len(log), 7):  # lines cut between writes
        watch.write(log[start : start + 7])
    assert capsys.readouterr().out == log  # passed on unchanged
    assert watch.accuracy == {0: 0.5, 1: 0.9, 2: 0.85}
    assert watch.summary() == "final validation accuracy: 0.8500 (epoch 2; best 0.9000 at epoch 1)"


@pytest.mark.parametrize(
    "exit_code, failure, error",
    [
        ("1", "ERROR-LINE", "ERROR-LINE"),  # compose said 0 (seen under load in CI), its container line 1
        ("137", None, "container x1-algo-1-ab exited with code 137"),
        ("0", "ERROR-LINE", None),  # a line from an attempt torchrun restarted, then the job ended well
        ("0", None, None),
    ],
)
def test_a_local_job_failed_when_a_container_did_whatever_docker_compose_said(
    tmp_path, monkeypatch, capsys, exit_code, failure, error
):
    """docker-compose 1.29 can exit 0 for a container that exited 1: its own "NAME exited with code N" line, from
    waiting on the container, decides, and the failure file the job's hosts left (in output.tar.gz) says why."""
    done = tmp_path / "job"
    done.mkdir()
    (done / "model.tar.gz").touch()
    with tarfile.open(done / "output.tar.gz", "w:gz") as tar:
        if failure:
            (tmp_path / "failure").write_text(f"Traceback...\n{failure}\n")
            tar.add(tmp_path / "failure", arcname="failure")

    def job(job):  # what SDK 2.x prints of a local job, then its model
        print(f"x1-algo-1-ab | Process exited with code 1\n\x1b[36mx1-algo-1-ab exited with code {exit_code}")
        return f"file://{done}/model.tar.gz"

    monkeypatch.setattr(sdk2, "run", job)
    code = run_sagemaker.main(["--image", "i", "--input", str(tmp_path), "--output", str(tmp_path)])
    out, err = capsys.readouterr()
    if error:
        assert code == 1, err
        assert re.fullmatch(
            rf"error: job \S+ failed \({re.escape(error)}\); the job's ERROR line above says why\n", err
        )
    else:
        assert code == 0 and f"model.tar.gz: {done}/model.tar.gz" in out and err == ""


@pytest.mark.parametrize("local", [True, False])
def test_only_a_local_jobs_log_is_kept(monkeypatch, capsys, local):
    """outcome.run keeps a local job's log, which it reads (and children.py after it); a cloud job's passes straight
    through, unkept: one running for hours with --wait would otherwise sit in memory whole."""
    line = "x1-algo-1-ab | epoch 0 step 3: val/acc=0.5000\n"
    seen = []

    model = "file:///o/x1/model.tar.gz" if local else "s3://b/out/x1/model.tar.gz"

    def run(job):  # the SDK printing the job's log to the standard output it finds
        seen.append(sys.stdout)
        print(line, end="")
        return model

    monkeypatch.setattr(sdk2, "run", run)
    started = job("--image", "i", "--input", "d", "--output", "o") if local else job(*CLOUD)
    stdout = sys.stdout
    assert outcome.run(started) == (model, line if local else None)
    assert capsys.readouterr().out == line  # shown as it passed, either way
    assert (seen[0] is stdout) is not local  # a cloud job's SDK writes to the stream itself: nothing in between
