"""Tuning jobs from `scripts/run_sagemaker.py tune`, through SDK 2.x and 3.x: CreateHyperParameterTuningJob for every
strategy on the moto server (which keeps the request's config and definition as it got them), held to the API's own
shapes (botocore's model: required members, types, enums, and the lengths, counts and patterns that botocore itself
leaves to the server), and as --dry-run prints it; the static hyperparameters of both SDKs' requests against the
local children's (children.static); a Pipeline's TuningStep with the image on moto, and the local pipeline's refusal."""

import json
import os
import re
import subprocess
import sys

import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError

from jobs import children, options, sdk2, spec, tuning

pytestmark = pytest.mark.cloud
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = {"v2": sys.executable, "v3": os.path.join(ROOT, ".venv-sdk3", "bin", "python")}
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-lightning:abc1234"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
JOB = ["--image", IMAGE, "--instance-type", "ml.g5.xlarge", "--instance-count", "2", "--role", ROLE, "--input",
       "s3://cifar-data/cifar10/", "--output", "s3://ml-jobs/jobs", "--job-name", "cifar", "--spot", "--max-run", "7200",
       "--network-isolation", "--subnets", "subnet-1", "--security-groups", "sg-1", "--tag", "project=cifar10",
       "--env", "NCCL_DEBUG=INFO", "--objective", "validation:accuracy", "--maximize", "--max-parallel-jobs", "2"]  # fmt: skip
STATIC = "data.val_split=0"  # a setting of the children's, after the options (positional words go last)
LR, BATCH = ["--range", "optimizer.lr=1e-3:1e-1:log"], ["--range", "data.batch_size=64,128"]
STRATEGIES = {  # strategy: its options, and what its config holds beyond the common part
    "Bayesian": ([*LR, *BATCH, "--max-jobs", "8", "--early-stopping", "auto", "--warm-start", "cifar-a,cifar-b"],
                 {"TrainingJobEarlyStoppingType": "Auto"}),
    "Random": ([*LR, "--range", "trainer.accumulate_grad_batches=1:4", "--max-jobs", "8"],
               {"TrainingJobEarlyStoppingType": "Off"}),
    "Hyperband": ([*LR, *BATCH, "--max-jobs", "8", "trainer.max_epochs=30"],
                  {"StrategyConfig": {"HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 30}}}),
    "Grid": ([*BATCH, "--range", "optimizer=SGD,Adam"], {}),
}  # fmt: skip


def tune(sdk: str, env: dict, *extra: str, static: str = STATIC) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [PYTHON[sdk], os.path.join(ROOT, "scripts", "run_sagemaker.py"), "tune", *JOB, *extra, static],
        env={**os.environ, **env, "SAGEMAKER_VALIDATE_ROLE": "false"},  # moto lacks IAM's SimulatePrincipalPolicy
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run


def shape_errors(value, shape, path="") -> list[str]:
    """Where `value` breaks the API's shape: what the server checks and botocore's client-side validation skips
    (lengths and counts above the maximum, patterns, enums), and the rest of it (required members, types)."""
    errors, kind, meta = [], shape.type_name, shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{path}: not a structure"]
        errors += [f"{path}.{m}: required" for m in shape.required_members if m not in value]
        for name, member in value.items():
            if name not in shape.members:
                errors.append(f"{path}.{name}: not a member")
            else:
                errors += shape_errors(member, shape.members[name], f"{path}.{name}")
    elif kind == "list":
        if not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
            errors.append(f"{path}: {len(value)} items, not {meta.get('min', 0)}-{meta.get('max')}")
        for i, item in enumerate(value):
            errors += shape_errors(item, shape.member, f"{path}[{i}]")
    elif kind == "map":
        if len(value) > meta.get("max", len(value)):
            errors.append(f"{path}: {len(value)} entries, above {meta['max']}")
        for k, v in value.items():
            errors += shape_errors(k, shape.key, f"{path} key") + shape_errors(v, shape.value, f"{path}[{k}]")
    elif kind == "string":
        if not isinstance(value, str) or not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
            errors.append(f"{path}: {value!r} is not a string of {meta.get('min', 0)}-{meta.get('max')} characters")
        elif "pattern" in meta and not re.search(python_regex(meta["pattern"]), value):
            errors.append(f"{path}: {value!r} does not match {meta['pattern']}")
        elif shape.enum and value not in shape.enum:
            errors.append(f"{path}: {value!r} is none of {shape.enum}")
    elif kind in ("integer", "long"):
        if not isinstance(value, int) or not meta.get("min", value) <= value <= meta.get("max", value):
            errors.append(f"{path}: {value!r} is not an integer within {meta.get('min')}-{meta.get('max')}")
    elif kind == "boolean" and not isinstance(value, bool):
        errors.append(f"{path}: {value!r} is not a boolean")
    return errors


def python_regex(pattern: str) -> str:
    """The model's Java-style pattern for Python's re: its Unicode classes \\p{L}, \\p{N}, \\p{M} (letters, digits,
    marks) as \\w and \\p{Z} (separators) as \\s, a superset of each."""
    for java, python in {r"\p{L}": r"\w", r"\p{N}": r"\w", r"\p{M}": r"\w", r"\p{Z}": r"\s"}.items():
        pattern = pattern.replace(java, python)
    return pattern


CREATE = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateHyperParameterTuningJob")


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_every_strategy_creates_its_tuning_job_on_the_moto_server(sdk, aws):
    sagemaker = boto3.client("sagemaker")
    for strategy, (words, config) in STRATEGIES.items():
        run = tune(sdk, aws, "--strategy", strategy, "--no-wait", *words)
        name = re.search(r"^started tuning job (\S+);", run.stdout, re.M)[1]
        assert len(name) <= 32 and name.startswith("cifar-")
        job = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        got = job["HyperParameterTuningJobConfig"]
        assert got["Strategy"] == strategy and got["HyperParameterTuningJobObjective"] == {
            "Type": "Maximize", "MetricName": "validation:accuracy"
        }  # fmt: skip
        assert got["ResourceLimits"] == {"MaxParallelTrainingJobs": 2, **({"MaxNumberOfTrainingJobs": 8} if strategy != "Grid" else {})}  # fmt: skip
        assert {k: got[k] for k in config} == config
        ranges = {r["Name"]: r for kind in got["ParameterRanges"].values() for r in kind}
        assert set(ranges) == {
            word.split("=")[0] for flag, word in zip(words, words[1:], strict=False) if flag == "--range"
        }
        if strategy != "Grid":
            assert ranges["optimizer.lr"] == {"Name": "optimizer.lr", "MinValue": "1e-3", "MaxValue": "1e-1",
                                              "ScalingType": "Logarithmic"}  # fmt: skip
        if strategy == "Bayesian":
            assert {p["HyperParameterTuningJobName"] for p in job["WarmStartConfig"]["ParentHyperParameterTuningJobs"]} == {"cifar-a", "cifar-b"}  # fmt: skip
            assert job["WarmStartConfig"]["WarmStartType"] == "IdenticalDataAndAlgorithm"
        definition = job["TrainingJobDefinition"]
        assert definition["AlgorithmSpecification"]["TrainingImage"] == IMAGE and definition["RoleArn"] == ROLE
        metrics = {m["Name"]: m["Regex"] for m in definition["AlgorithmSpecification"]["MetricDefinitions"]}
        assert metrics["validation:accuracy"] == r"val/acc=([0-9.]+)"
        assert definition["EnableManagedSpotTraining"] is True and definition["EnableNetworkIsolation"] is True
        assert definition["CheckpointConfig"] == {"S3Uri": f"s3://ml-jobs/jobs/{name}/checkpoints/",
                                                  "LocalPath": "/opt/ml/checkpoints"}  # fmt: skip
        assert definition["StaticHyperParameters"]["data.val_split"] == "0"
        assert not set(ranges) & set(definition["StaticHyperParameters"])
        assert definition["Environment"] == {"DATA_CHANNEL": "training", "NCCL_DEBUG": "INFO"}
        assert definition["VpcConfig"] == {"Subnets": ["subnet-1"], "SecurityGroupIds": ["sg-1"]}
        assert definition["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
        assert definition["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == "s3://cifar-data/cifar10/"
        assert definition["OutputDataConfig"]["S3OutputPath"] == "s3://ml-jobs/jobs"
        # what moto kept is what the SDK sent: held to the API's shape as SageMaker's server would hold it
        sent = {"HyperParameterTuningJobName": name, "HyperParameterTuningJobConfig": got, "TrainingJobDefinition":
                definition, **({"WarmStartConfig": job["WarmStartConfig"]} if job.get("WarmStartConfig") else {})}  # fmt: skip
        assert shape_errors(sent, CREATE.input_shape) == [], strategy


def test_the_shape_check_finds_what_the_server_would_refuse():
    """The check itself: a request botocore lets through but SageMaker would refuse (a name of 33 characters, a
    regex over 500 characters, 6 warm-start parents, an unknown strategy)."""
    bad = {
        "HyperParameterTuningJobName": "x" * 33,
        "HyperParameterTuningJobConfig": {"Strategy": "Annealing", "ResourceLimits": {"MaxParallelTrainingJobs": 1}},
        "TrainingJobDefinition": {
            "AlgorithmSpecification": {"TrainingInputMode": "File", "MetricDefinitions": [{"Name": "m", "Regex": "r" * 501}]},
            "RoleArn": ROLE, "OutputDataConfig": {"S3OutputPath": "s3://b/o"}, "StoppingCondition": {},
        },
        "WarmStartConfig": {"WarmStartType": "IdenticalDataAndAlgorithm",
                            "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": f"p{i}"} for i in range(6)]},
    }  # fmt: skip
    found = shape_errors(bad, CREATE.input_shape)
    assert [e.split(":")[0] for e in found] == [
        ".HyperParameterTuningJobName",
        ".HyperParameterTuningJobConfig.Strategy",
        ".TrainingJobDefinition.AlgorithmSpecification.MetricDefinitions[0].Regex",
        ".WarmStartConfig.ParentHyperParameterTuningJobs",
    ], found


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_the_dry_run_prints_the_request_whose_static_hyperparameters_the_local_children_get(sdk, user_project):
    """--dry-run with --source-dir: the request, held to the API's shape, sent nowhere (no credentials, an endpoint that
    answers nothing); its StaticHyperParameters are children.static's, which the local children get, but for where
    the code is."""
    words = ["--source-dir", user_project, "--range", "model.hidden=8,16", "--strategy", "Grid", "--distribution",
             "torch_distributed", "trainer.max_epochs=2"]  # fmt: skip
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    request = json.loads(tune(sdk, offline, "--dry-run", *words, static="model.lr=0.1").stdout)
    assert shape_errors(request, CREATE.input_shape) == [] and "MaxNumberOfTrainingJobs" not in str(request)
    sent = request["TrainingJobDefinition"]["StaticHyperParameters"]
    args = options.parse_args(["tune", *JOB, "--dry-run", *words, "model.lr=0.1"])
    t = tuning.make_tuning(args, spec.make_job(args, installed=sdk))
    code = sent["sagemaker_submit_directory"]
    expected = children.static(t, json.loads(code) if sdk == "v2" else code, "us-east-1")
    if sdk == "v2":
        expected["sagemaker_job_name"] = sent["sagemaker_job_name"]  # the name carries the second it was made
    assert sent == expected


def test_a_pipelines_tuning_step_with_the_image_is_created_on_moto_and_refused_by_local_pipelines(aws, monkeypatch):
    """SDK 2.x: a TuningStep of the launcher's own tuner; the pipeline's definition on the moto server holds the
    tuning request. The local pipeline session refuses to start a pipeline with a tuning step."""
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", os.path.join(ROOT, "scripts", "sagemaker_config.yaml"))
    from sagemaker.workflow.pipeline import Pipeline
    from sagemaker.workflow.pipeline_context import LocalPipelineSession, PipelineSession
    from sagemaker.workflow.steps import TuningStep

    args = options.parse_args(["tune", *JOB, "--strategy", "Random", *STRATEGIES["Random"][0], STATIC])
    t = tuning.make_tuning(args, spec.make_job(args, installed="v2"))
    session = PipelineSession(boto_session=boto3.Session())
    step = TuningStep(
        name="Tune", step_args=sdk2.tuner(t, session).fit(sdk2.channels(t.job), include_cls_metadata=False)
    )
    Pipeline(name="cifar-tuning", steps=[step], sagemaker_session=session).create(role_arn=ROLE)
    stored = boto3.client("sagemaker").describe_pipeline(PipelineName="cifar-tuning")
    (tune_step,) = json.loads(stored["PipelineDefinition"])["Steps"]
    assert tune_step["Type"] == "Tuning"
    arguments = tune_step["Arguments"]
    assert arguments["HyperParameterTuningJobConfig"]["Strategy"] == "Random"
    assert arguments["TrainingJobDefinition"]["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert arguments["TrainingJobDefinition"]["StaticHyperParameters"] == {"data.val_split": "0"}

    local = LocalPipelineSession()
    step = TuningStep(name="Tune", step_args=sdk2.tuner(t, local).fit(sdk2.channels(t.job), include_cls_metadata=False))
    pipeline = Pipeline(name="local-tuning", steps=[step], sagemaker_session=local)
    pipeline.create(role_arn=ROLE)
    with pytest.raises(ClientError, match="Step type Tuning is not supported in local mode"):
        pipeline.start()
