"""`run_sagemaker.py best TUNING_JOB` against botocore's Stubber, which holds every request and response to the shapes
of the SageMaker API (moto's DescribeHyperParameterTuningJob answers a fixed fake best job, which no
DescribeTrainingJob knows); and the project's own parser asked about a tuning job's keys (jobs/project.py)."""

import datetime
import os

import boto3
import pytest
from botocore.stub import Stubber

import run_sagemaker
from jobs import options, project, spec, tuning

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
NAME = "lightning-20261128-120000"
CHILD = f"{NAME}-003-1a2b3c4d"
MODEL = f"s3://my-bucket/jobs/{CHILD}/output/model.tar.gz"
WHEN = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
ARN = "arn:aws:sagemaker:us-east-1:123456789012"


def summary(name: str, value: float, tuning_job: str = NAME) -> dict:
    """A HyperParameterTrainingJobSummary as DescribeHyperParameterTuningJob returns a best child."""
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"{ARN}:training-job/{name}",
        "TuningJobName": tuning_job,
        "CreationTime": WHEN,
        "TrainingJobStatus": "Completed",
        "TunedHyperParameters": {"optimizer.lr": "0.0123", "data.batch_size": "128"},
        "FinalHyperParameterTuningJobObjectiveMetric": {
            "Type": "Maximize",
            "MetricName": "validation:accuracy",
            "Value": value,
        },
        "ObjectiveStatus": "Succeeded",
    }


def tuning_job(status: str, **best) -> dict:
    return {
        "HyperParameterTuningJobName": NAME,
        "HyperParameterTuningJobArn": f"{ARN}:hyper-parameter-tuning-job/{NAME}",
        "HyperParameterTuningJobConfig": {"Strategy": "Bayesian", "ResourceLimits": {"MaxParallelTrainingJobs": 2}},
        "HyperParameterTuningJobStatus": status,
        "CreationTime": WHEN,
        "TrainingJobStatusCounters": {"Completed": 3},
        "ObjectiveStatusCounters": {"Succeeded": 3},
        **best,
    }


def training_job(name: str) -> dict:
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"{ARN}:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://my-bucket/jobs/{name}/output/model.tar.gz"},
        "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed",
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "i"},
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": WHEN,
    }


@pytest.fixture
def sagemaker(monkeypatch):
    """The client `best` makes, stubbed: each call must be the next one added, shaped as the API documents."""
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    monkeypatch.setattr(boto3, "client", lambda service, **kwargs: client)
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def test_best_names_the_child_its_objective_hyperparameters_and_model(sagemaker, capsys):
    sagemaker.add_response("describe_hyper_parameter_tuning_job", tuning_job("Completed", BestTrainingJob=summary(CHILD, 0.9375)),
                           {"HyperParameterTuningJobName": NAME})  # fmt: skip
    sagemaker.add_response("describe_training_job", training_job(CHILD), {"TrainingJobName": CHILD})
    assert run_sagemaker.main(["best", NAME]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"best child: {CHILD} of {NAME} (Completed; tuning job Completed)",
        "objective: validation:accuracy = 0.9375 (Maximize)",
        "hyperparameters: data.batch_size=128 optimizer.lr=0.0123",
        f"model.tar.gz: {MODEL}",
    ]


def test_with_warm_start_best_is_the_best_of_the_job_and_its_parents(sagemaker, capsys):
    parents_child = "parent-20261120-000000-007-deadbeef"
    found = tuning_job(
        "InProgress",
        BestTrainingJob=summary(CHILD, 0.9),
        OverallBestTrainingJob=summary(parents_child, 0.95, tuning_job="parent-20261120-000000"),
    )
    sagemaker.add_response("describe_hyper_parameter_tuning_job", found, {"HyperParameterTuningJobName": NAME})
    sagemaker.add_response("describe_training_job", training_job(parents_child), {"TrainingJobName": parents_child})
    run_sagemaker.main(["best", NAME])
    first, objective, _, model = capsys.readouterr().out.splitlines()
    assert first == f"best child: {parents_child} of parent-20261120-000000 (Completed; tuning job InProgress)"
    assert objective.endswith("= 0.95 (Maximize)") and model.endswith(f"/{parents_child}/output/model.tar.gz")


def test_a_tuning_job_with_no_finished_child_or_none_at_all_is_one_line(sagemaker):
    sagemaker.add_response("describe_hyper_parameter_tuning_job", tuning_job("InProgress"))
    with pytest.raises(SystemExit, match=f"^error: tuning job {NAME} \\(InProgress\\) has no child with an objective"):
        run_sagemaker.main(["best", NAME])
    sagemaker.add_client_error(
        "describe_hyper_parameter_tuning_job", "ResourceNotFound", f"Amazon SageMaker can't find a tuning job {NAME}"
    )
    with pytest.raises(SystemExit) as e:
        run_sagemaker.main(["best", NAME])
    assert str(e.value).startswith(f"error: tuning job {NAME}: An error occurred (ResourceNotFound)")
    assert "\n" not in str(e.value)


def test_the_projects_parser_refusal_is_one_line():
    jsonargparse = """usage: train.py [options] fit [-c CONFIG]
error: Parser key "optimizer":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'torch.optim.SGD':
        Option 'learning_rate' is not accepted
    - Expected a <class 'NoneType'>
"""
    assert project.refusal(jsonargparse) == """Parser key "optimizer": Option 'learning_rate' is not accepted"""
    assert project.refusal("usage: ...\nerror: unrecognized arguments: --model.hiden=8\n") == (
        "unrecognized arguments: --model.hiden=8"
    )
    assert project.refusal("Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n") is None


def test_the_probe_gives_the_static_settings_and_each_ranges_low_end():
    args = options.parse_args(["tune", "--image", "i", "--input", "d", "--output", "o", "--objective",
                               "validation:accuracy", "--maximize", "--range", "optimizer.lr=1e-4:1e-1:log",
                               "--range", "data.batch_size=64,128", "--max-jobs", "2", "trainer.max_epochs=2",
                               "--distribution", "mpi"])  # fmt: skip
    t = tuning.make_tuning(args, spec.make_job(args, "v2"))
    assert project.arguments(t) == [
        "fit", "--print_config", "--trainer.max_epochs=2", "--optimizer.lr=0.0001", "--data.batch_size=64"
    ]  # fmt: skip
    assert project.entry(t) == os.path.join(ROOT, "app", "example", "train.py")


def test_the_examples_own_parser_refuses_a_key_it_lacks(capsys):
    """The real probe: the image's example, its imports and parser (8-16 s on 2 cores)."""
    args = options.parse_args(["tune", "--image", "i", "--input", "d", "--output", "o", "--objective",
                               "validation:accuracy", "--maximize", "--range", "optimizer.learning_rate=1e-4:1e-1",
                               "--max-jobs", "2"])  # fmt: skip
    t = tuning.make_tuning(args, spec.make_job(args, "v2"))
    with pytest.raises(SystemExit) as e:
        project.check(t)
    assert str(e.value) == (
        "error: train.py refuses the job's settings (optimizer.learning_rate and the static ones): "
        """Parser key "optimizer": Option 'learning_rate' is not accepted"""
    )
