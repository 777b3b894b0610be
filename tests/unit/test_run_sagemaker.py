"""scripts/run_sagemaker.py: distributions as the framework hyperparameters SDK 2.x's PyTorch estimator sets."""

import json

import pytest
from sagemaker.estimator import EstimatorBase
from sagemaker.pytorch import PyTorch

import run_sagemaker


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
    estimator = PyTorch(entry_point="launch.py", image_uri="123.dkr.ecr.us-east-1.amazonaws.com/x:1",
                        role=run_sagemaker.LOCAL_ROLE, instance_count=2, instance_type="ml.p4d.24xlarge",
                        distribution=distribution)  # fmt: skip
    expected = EstimatorBase._json_encode_hyperparameters(estimator._pytorch_distribution_configuration(distribution))
    processes = distribution.get("mpi", {}).get("processes_per_host")
    assert run_sagemaker.framework_hyperparameters(name, "ml.p4d.24xlarge", processes) == expected


def test_no_distribution_adds_nothing_but_a_process_count():
    assert run_sagemaker.framework_hyperparameters("none", "local", None) == {}
    assert run_sagemaker.framework_hyperparameters("none", "local", 2) == {"sagemaker_mpi_num_of_processes_per_host": "2"}


def test_hyperparameter_words():
    assert run_sagemaker.hyperparameters(["a.b=1", "c=x=y", "d="]) == {"a.b": "1", "c": "x=y", "d": ""}
    with pytest.raises(SystemExit, match="'oops' is not key=value"):
        run_sagemaker.hyperparameters(["oops"])


def test_the_other_sdk_is_named_with_its_venv(capsys):
    with pytest.raises(SystemExit, match="--sdk v3 needs SageMaker SDK 3.x, but 2.x is installed here; run .venv-sdk3/bin/python"):
        run_sagemaker.main(["--sdk", "v3", "--image", "x", "--input", "d", "--output", "o"])
    assert json.loads(run_sagemaker.framework_hyperparameters("mpi", "local", None)["sagemaker_mpi_enabled"]) is True
