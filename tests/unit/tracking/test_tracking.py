"""Experiment tracking's rules without a server (tracking/: uri.py, record.py, tracker.py, mlflow_run.py,
mlflow_client.py): which URIs are taken, which run a job
continues, how a configuration becomes parameters, what a failed request means, and that a server nobody answers at
costs a job one line and a bounded wait. tests/toolkit/test_tracking_toolkit.py runs jobs against a real server."""

import os
import re
import socket
import time

import pytest
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos import databricks_pb2 as codes

import train
from sagemaker_lightning.boot import signals
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.plan import make_plan
from sagemaker_lightning.toolbox.concern import Context
from sagemaker_lightning.toolbox.redact import shown_url
from sagemaker_lightning.tracking import mlflow_client, mlflow_run, record, tracker
from sagemaker_lightning.tracking.uri import DEFAULT_EXPERIMENT, check_uri, experiment_name

pytestmark = pytest.mark.unit

SERVER = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/my-server"
APP = "arn:aws-cn:sagemaker:cn-north-1:123456789012:mlflow-app/app-ABC123"


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:5000", "https://mlflow.example.com/prefix", "http://user:secret@host:80", SERVER, APP]
)
def test_an_http_url_or_a_sagemaker_mlflow_arn_is_taken(uri):
    assert check_uri(uri) == uri


@pytest.mark.parametrize(
    "uri, message",
    [
        ("localhost:5000", "is neither an http(s) URL"),
        ("http://", "is neither an http(s) URL"),
        ("file:///tmp/mlruns", "is neither an http(s) URL"),
        ("http://host:port", "is neither an http(s) URL"),
        ("http://my host:5000", "is neither an http(s) URL"),
        ("https://user:secret@:443", "https://:443 is neither"),  # the password is not shown
        ("arn:aws:sagemaker:us-east-1:1234:mlflow-tracking-server/x", "is not a SageMaker MLflow ARN"),
        ("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/", "is not a SageMaker MLflow ARN"),
        ("arn:aws:sagemaker:us-east-1:123456789012:training-job/x", "is not a SageMaker MLflow ARN"),
        ("arn:aws:s3:::bucket", "is not a SageMaker MLflow ARN"),
    ],
)
def test_a_malformed_uri_or_arn_is_one_line_naming_the_forms(uri, message):
    with pytest.raises(UserError) as e:
        check_uri(uri)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "secret" not in str(e.value)


def test_a_malformed_uri_in_the_jobs_environment_fails_the_job_at_its_start_in_one_line(
    as_script, archive_dir, tmp_path, monkeypatch, capsys
):
    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0"}
    job |= {"SM_OUTPUT_DIR": str(tmp_path), "MLFLOW_TRACKING_URI": "mlflow.example.com:5000"}
    monkeypatch.setattr(os, "environ", {**os.environ, **job})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    with pytest.raises(SystemExit) as exit:
        as_script(train.main, [f"--data.data_dir={archive_dir}", "--trainer.max_epochs=1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1, errors
    assert "the MLflow tracking URI mlflow.example.com:5000 is neither an http(s) URL" in errors[0]
    assert "MLflow tracking URI" in (tmp_path / "failure").read_text()


SETTINGS = {"mlflow.tracking_uri": None, "mlflow.experiment_name": None, "mlflow.log_model": False}
SETTINGS |= {"mlflow.system_metrics": False, "model_dir": None}


def test_on_sagemaker_the_variable_turns_it_on_elsewhere_the_setting_alone(monkeypatch):
    import lightning.pytorch as pl

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    job = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1", "SM_CURRENT_INSTANCE_TYPE": "ml.g5.xlarge"}
    job["TRAINING_JOB_NAME"] = "cifar-2026-11-27-18-34-51-123"  # the plan reads the job's name with its environment
    on, off = make_plan(job, {"eth0"}), make_plan({}, set())
    (made,) = tracker.concern(Context(pl=pl, plan=on, config=SETTINGS)).after_checkpoints
    assert (made.uri, made.experiment, made.job) == (
        "http://127.0.0.1:5000",
        "cifar",
        job["TRAINING_JOB_NAME"],
    )
    assert made.tags == {
        "sagemaker.job_name": made.job,
        "sagemaker.hosts": "algo-1,algo-2",
        "sagemaker.instance_type": "ml.g5.xlarge",
    }
    assert (
        tracker.concern(Context(pl=pl, plan=off, config=SETTINGS)).after_checkpoints == []
    )  # a shell variable is not a setting
    given = {**SETTINGS, "mlflow.tracking_uri": "https://mlflow.example.com"}
    (made,) = tracker.concern(Context(pl=pl, plan=off, config=given)).after_checkpoints
    assert made.uri == "https://mlflow.example.com" and made.tags == {}


def test_the_experiment_is_the_setting_the_variable_the_loggers_or_the_jobs_base_name():
    job = "cifar-2026-11-27-18-34-51-123"
    assert experiment_name("mine", {"MLFLOW_EXPERIMENT_NAME": "env"}, "own", job) == "mine"
    assert experiment_name(None, {"MLFLOW_EXPERIMENT_NAME": "env"}, "own", job) == "env"
    assert experiment_name(None, {}, "own", job) == "own"
    assert experiment_name(None, {}, "lightning_logs", job) == "cifar"  # Lightning's default names nothing
    assert experiment_name(None, {}, None, "my-job") == "my-job"
    assert experiment_name(None, {}, None, None) == DEFAULT_EXPERIMENT


def test_a_restart_continues_its_jobs_run_and_another_jobs_checkpoints_start_a_new_one(capsys):
    """The record, or the checkpoint's state, proposes a run for the same job only (the run must agree: refusal);
    MLFLOW_RUN_ID names one explicitly. Off SageMaker a job is its checkpoint directory: a record written by the old
    rule there (job null) proposes nothing."""
    mine, theirs = {"run_id": "r1", "job": "a"}, {"run_id": "r0", "job": "b"}
    assert record.continued({}, mine, {}, "a") == ("r1", False)  # the checkpoint directory's record
    assert record.continued({}, {}, mine, "a") == ("r1", False)  # the checkpoint's, where the record is gone
    assert record.continued({"MLFLOW_RUN_ID": "r9"}, mine, mine, "a") == ("r9", True)  # the explicit one wins
    assert record.continued({}, {}, {}, "a") == (None, False)
    assert capsys.readouterr().out == ""
    assert record.continued({}, theirs, {}, "a") == (None, False)
    assert "MLFLOW_RUN_ID=r0 continues that one instead" in capsys.readouterr().out
    assert record.continued({}, {"run_id": "r0", "job": None}, {}, None) == (None, False)  # nothing names this job
    assert record.continued({}, {"run_id": "r0", "job": None}, {}, "/ckpt") == (None, False)
    assert "the checkpoints are job None's (run r0), not this job's (/ckpt)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "job, dirpath, named",
    [
        ("cifar-2026-11-27-18-34-51-123", "/opt/ml/checkpoints", "cifar-2026-11-27-18-34-51-123"),  # SageMaker's name
        (None, "s3://b/runs/a/", "s3://b/runs/a"),
        (None, "s3://b/runs/x/../a", "s3://b/runs/a"),
        (None, "file:///mnt/ckpt/./a/", "/mnt/ckpt/a"),
        (None, "/mnt/ckpt/a/", "/mnt/ckpt/a"),
        (None, None, None),
    ],
)
def test_a_job_is_its_name_on_sagemaker_and_its_checkpoint_directory_elsewhere(job, dirpath, named):
    assert record.identity(job, dirpath) == named


def test_a_local_checkpoint_directory_is_named_resolved_so_a_copy_is_another_job(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert record.identity(None, str(tmp_path / "link")) == record.identity(None, str(tmp_path / "a" / "sub" / ".."))
    assert record.identity(None, str(tmp_path / "copy")) != record.identity(None, str(tmp_path / "a"))


@pytest.mark.parametrize(
    "run_experiment, tags, experiment, job, why",
    [
        ("1", {record.JOB: "a"}, "1", "a", None),  # a restart of the job: continued
        ("2", {record.JOB: "a"}, "1", "a", "it is in another experiment (id 2)"),  # a planted record: another team's
        ("2", {record.JOB: "a"}, None, "a", "it is in another experiment (id 2)"),  # this job's experiment not made yet
        ("1", {record.JOB: "b"}, "1", "a", f"its tag {record.JOB} names b, not this job (a)"),  # another job's
        ("1", {}, "1", "a", f"its tag {record.JOB} names no job, not this job (a)"),  # made by no job of the runtime
        ("1", {record.JOB: "/ckpt/a"}, "1", "/ckpt/b", f"its tag {record.JOB} names /ckpt/a, not this job (/ckpt/b)"),
        ("1", {record.JOB: "a"}, "1", None, f"its tag {record.JOB} names a, not this job (None)"),
    ],
)
def test_a_proposed_run_is_continued_only_where_the_run_agrees(run_experiment, tags, experiment, job, why):
    assert record.refusal(run_experiment, tags, experiment, job) == why


def test_a_uri_is_shown_without_its_password():
    assert shown_url("https://user:secret@mlflow.example.com:443/x") == "https://mlflow.example.com:443/x"
    assert shown_url(SERVER) == SERVER


def test_the_record_is_written_whole_and_read_back(tmp_path):
    assert record.read_record(str(tmp_path)) == {} and record.read_record(None) == {}
    record.write_record(str(tmp_path / "ckpts"), {"run_id": "r1", "job": "a"})
    assert record.read_record(str(tmp_path / "ckpts")) == {"run_id": "r1", "job": "a"}
    assert os.listdir(tmp_path / "ckpts") == [record.RECORD]  # no partial file left
    (tmp_path / "ckpts" / record.RECORD).write_text("{cut sh")
    assert record.read_record(str(tmp_path / "ckpts")) == {}


def test_a_configuration_becomes_dotted_parameters_with_keys_and_values_mlflow_takes():
    config = {"trainer": {"max_epochs": 3, "callbacks": [{"class_path": "x"}], "logger": None}, "a b[0]": "s" * 7000}
    params = mlflow_client.flat(config)
    assert params["trainer.max_epochs"] == "3" and params["trainer.logger"] == "null"
    assert params["trainer.callbacks"] == '[{"class_path": "x"}]'
    assert params["a b_0_"] == "s" * mlflow_client.MAX_VALUE  # a key MLflow refuses is mended, a long value cut
    assert mlflow_client.flat({"empty": {}}) == {"empty": "{}"}


@pytest.mark.parametrize(
    "error, meaning",
    [
        (MlflowException("API request to http://h/api failed with exception Connection refused"), "unreachable"),
        (MlflowException("x", error_code=codes.TEMPORARILY_UNAVAILABLE), "unreachable"),  # 503
        (MlflowException("x", error_code=codes.REQUEST_LIMIT_EXCEEDED), "unreachable"),  # 429: throttled
        (MlflowException("x failed with error code 403 != 200", error_code=codes.PERMISSION_DENIED), "refused"),
        (MlflowException("x", error_code=codes.UNAUTHENTICATED), "refused"),  # 401
        (MlflowException("API request to http://h/api failed with exception Unable to locate credentials"), "refused"),
        (RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "Changing param values"}), "rejected"),
        (RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no run"}), "rejected"),
        (FileNotFoundError(2, "No such file", "model.pt"), "rejected"),
        (ConnectionResetError(), "unreachable"),
    ],
)
def test_a_failed_request_is_retried_only_where_an_answer_may_come(error, meaning):
    assert mlflow_client.kind(error) == meaning


def test_a_server_nobody_answers_at_costs_one_line_and_a_bounded_end(free_port, capsys):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every request is refused at once
    run = mlflow_run.Run(uri=uri, experiment="e", name="job", tags={}, continues=None, opened=lambda *_: None)
    run.params({"a": "1"})
    for step in range(1, 50):
        run.log({"train/loss": 0.5}, step)
    deadline = time.monotonic() + 30
    while run._trouble is None:  # the first request failed: retried (a job trains on meanwhile)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run.finish("FINISHED", wait_s=30)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mlflow: ")]
    assert len(said) == 2, said
    refused = r"\(\[Errno 111\] Connection refused\)"
    assert re.fullmatch(rf"mlflow: {uri} does not answer {refused}: tracking retried, .* training goes on", said[0])
    assert said[1].startswith(f"mlflow: {uri} did not answer at the end") and "tracking dropped" in said[1]
    assert not run._thread.is_alive()


def test_a_server_that_accepts_and_never_answers_is_given_up_after_the_request_timeout(monkeypatch, capsys):
    """A slow server: connections are accepted (the kernel's backlog) and nothing answers. Each request ends after
    MLFLOW_HTTP_REQUEST_TIMEOUT (1 s here; the runtime's default 10 s), said once, and the end gives up too."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        run = mlflow_run.Run(uri=uri, experiment="e", name="job", tags={}, continues=None, opened=lambda *_: None)
        run.log({"train/loss": 0.5}, 1)
        deadline = time.monotonic() + 30
        while run._trouble is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run.finish("KILLED", wait_s=30)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mlflow: ")]
    assert len(said) == 2 and "timed out" in said[0] and "tracking retried" in said[0], said
    assert said[1].startswith(f"mlflow: {uri} did not answer at the end") and not run._thread.is_alive(), said
