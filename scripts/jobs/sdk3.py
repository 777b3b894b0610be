"""SDK 3.x's adapter: a job (spec.Job) started as a ModelTrainer(training_image=...), Mode.LOCAL_CONTAINER for the
local instance types; --source-dir code runs under SDK 3.x's own driver, which takes the settings nested (nested()).
A tuning job (tuning.Tuning): SDK 3.x's HyperparameterTuner around the children's ModelTrainer. The SDK is imported
when a job starts, after every check (spec.make_job, tuning.make_tuning).

    .venv-sdk3/bin/python scripts/run_sagemaker.py --image sagemaker-lightning:latest --input data/synthetic \\
        --output runs trainer.max_epochs=1

    from jobs import sdk3  # from scripts/; nested() needs no SDK

    sdk3.nested({"trainer.max_epochs": "3", "data": "X", "data.batch_size": "32"})
"""

import os

from jobs import dry_run
from jobs.spec import CHECKPOINTS, Job
from jobs.tuning import Tuning
from sagemaker_lightning.launch.hyperparameters import typed


def nested(hyperparameters: dict[str, str]) -> dict:
    """Dotted settings as nested groups, the form SDK 3.x's driver accepts: it exports each top-level key as a shell
    variable, and a dot stops it ("not a valid identifier") before any code runs. A value and settings under the
    same key are a class and its arguments: data=X data.batch_size=32 → {"data": {"class_path": "X", "init_args":
    {"batch_size": 32}}}. Values are typed as the runtime types them (JSON, else a Python literal, else a string)."""
    tree: dict = {}
    for key, value in hyperparameters.items():
        *groups, last = key.replace(".init_args.", ".").split(".")  # data.init_args.x is data.x to jsonargparse
        node = tree
        for group in groups:
            node = _settings_of(node, group)
        value, current = typed(value), node.get(last)
        if isinstance(current, dict) and isinstance(value, dict):
            node[last] = {**value, **current}
        elif isinstance(current, dict):  # its settings came first: `value` is their class
            node[last] = {"class_path": value, "init_args": current.get("init_args", current)}
        else:
            node[last] = value
    return tree


def _settings_of(node: dict, key: str) -> dict:
    """The dict where settings under node[key] go: node[key] itself, or its init_args when it names a class."""
    current = node.get(key)
    if current is None or not isinstance(current, dict):
        node[key] = {} if current is None else {"class_path": current, "init_args": {}}
    return node[key].setdefault("init_args", {}) if "class_path" in node[key] else node[key]


def channel(name: str, source: str, input_mode: str):
    """An input channel: an S3 prefix in `input_mode`, built as a Channel of its own (an InputData from a URI string
    becomes a File channel, whatever the job's training_input_mode); a local directory (local mode) as InputData."""
    from sagemaker.train.configs import Channel, DataSource, InputData, S3DataSource

    if not source.startswith("s3://"):
        return InputData(channel_name=name, data_source=source[len("file://") :])
    s3 = S3DataSource(s3_data_type="S3Prefix", s3_uri=source, s3_data_distribution_type="FullyReplicated")
    return Channel(channel_name=name, data_source=DataSource(s3_data_source=s3), input_mode=input_mode)


def trainer(job: Job, tuned: bool = False):
    """The ModelTrainer that runs `job`; in the cloud with all of the job's settings. tuned: for a tuning job's
    children, which SDK 3.x's driver never runs (the tuning API has no ContainerEntrypoint): the tuner ships
    --source-dir as sagemaker_program and sagemaker_submit_directory for the image's toolkit, so the settings stay
    dotted and the framework hyperparameters pick the runner, as without --source-dir."""
    import boto3
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        MetricDefinition,
        Networking,
        OutputDataConfig,
        RetryStrategy,
        StoppingCondition,
        Tag,
    )
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import SourceCode
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import Mode

    if job.dry_run:
        os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"  # SDK 3.x checks the role through IAM: not in a dry run
    if job.local:
        settings = dict(
            training_mode=Mode.LOCAL_CONTAINER,
            local_container_root=local_root(job),
            compute=Compute(
                instance_type="local_cpu" if job.instance_type == "local" else job.instance_type,
                instance_count=job.instance_count,
            ),
        )
    else:
        boto_session = boto3.Session()
        if job.dry_run:
            dry_run.intercept(boto_session)
        settings = dict(
            sagemaker_session=Session(boto_session=boto_session),
            compute=Compute(
                instance_type=job.instance_type,
                instance_count=job.instance_count,
                enable_managed_spot_training=job.spot,
                keep_alive_period_in_seconds=job.keep_alive,
            ),
            stopping_condition=StoppingCondition(
                max_runtime_in_seconds=job.max_run, max_wait_time_in_seconds=job.max_wait
            ),
            output_data_config=OutputDataConfig(s3_output_path=job.output),
            checkpoint_config=CheckpointConfig(s3_uri=job.checkpoints, local_path=CHECKPOINTS),
            networking=Networking(
                enable_network_isolation=job.network_isolation,
                subnets=job.subnets,
                security_group_ids=job.security_groups,
            ),
            tags=[Tag(key=k, value=v) for k, v in job.tags.items()] or None,
        )
    hyperparameters = job.hyperparameters
    if job.source_dir:
        requirements = "requirements.txt" if os.path.isfile(os.path.join(job.source_dir, "requirements.txt")) else None
        settings["source_code"] = SourceCode(
            source_dir=job.source_dir, entry_script=job.entry_point, requirements=requirements
        )
    if job.source_dir and not tuned:  # SDK 3.x's own driver runs the code (sm_train.sh): nested settings, its runners
        hyperparameters = nested({k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")})
        if job.distribution == "torch_distributed":  # else none (spec.make_job: SDK 3.x's driver runs no other)
            settings["distributed"] = Torchrun(process_count_per_node=job.processes_per_host)
    model_trainer = ModelTrainer(
        training_image=job.image,
        role=job.role,
        base_job_name=job.name,
        hyperparameters=hyperparameters,
        environment=job.environment,
        training_input_mode=job.channel_input_mode,
        **settings,
    )
    if not job.local:
        model_trainer = model_trainer.with_metric_definitions(
            [MetricDefinition(name=n, regex=r) for n, r in job.metrics.items()]
        )
        if job.max_retry_attempts is not None:
            model_trainer = model_trainer.with_retry_strategy(
                RetryStrategy(maximum_retry_attempts=job.max_retry_attempts)
            )
    return model_trainer


def local_root(job: Job) -> str:
    """Where SDK 3.x local mode keeps the job's files: in the job's folder of --output."""
    root = os.path.join(job.output[len("file://") :], job.name)
    os.makedirs(root, exist_ok=True)
    return root


def inputs(job: Job) -> list:
    return [channel(name, source, job.channel_input_mode) for name, source in job.inputs.items()]


def run(job: Job) -> str | None:
    """Start the job; wait for it unless job.wait is False. Returns the model.tar.gz URI: in local mode always, in the
    cloud when it waited."""
    model_trainer = trainer(job)
    model_trainer.train(input_data_config=inputs(job), wait=job.wait, logs=job.wait)
    if job.local:
        return f"file://{local_root(job)}/compressed_artifacts/model.tar.gz"  # where SDK 3.x local mode packs it
    return model_trainer._latest_training_job.model_artifacts.s3_model_artifacts if job.wait else None


def tune(tuning: Tuning) -> None:
    """Create the tuning job (SDK 3.x's HyperparameterTuner around the children's ModelTrainer); wait for it to end if
    job.wait. SDK 3.27.0's tuner leaves EnableNetworkIsolation out of the children's definition: put back here."""
    from sagemaker.core.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter
    from sagemaker.core.shapes import (
        HyperbandStrategyConfig,
        HyperParameterTuningJobStrategyConfig,
        HyperParameterTuningJobWarmStartConfig,
        ParentHyperParameterTuningJob,
    )
    from sagemaker.train.tuner import HyperparameterTuner

    ranges = tuning.sdk_ranges(CategoricalParameter, ContinuousParameter, IntegerParameter)
    job = tuning.job
    hyperband = None
    if tuning.hyperband:
        low, high = tuning.hyperband
        hyperband = HyperParameterTuningJobStrategyConfig(
            hyperband_strategy_config=HyperbandStrategyConfig(min_resource=low, max_resource=high)
        )
    parents = None
    if tuning.warm_start:
        parents = HyperParameterTuningJobWarmStartConfig(
            parent_hyper_parameter_tuning_jobs=[
                ParentHyperParameterTuningJob(hyper_parameter_tuning_job_name=p) for p in tuning.warm_start
            ],
            warm_start_type="IdenticalDataAndAlgorithm",
        )
    model_trainer = trainer(job, tuned=True)
    if job.network_isolation:
        isolate(model_trainer.sagemaker_session.boto_session)
    HyperparameterTuner(
        model_trainer,
        objective_metric_name=tuning.objective,
        objective_type=tuning.objective_type,
        hyperparameter_ranges=ranges,
        metric_definitions=[{"Name": n, "Regex": r} for n, r in job.metrics.items()],
        strategy=tuning.strategy,
        strategy_config=hyperband,
        max_jobs=tuning.max_jobs,
        max_parallel_jobs=tuning.max_parallel_jobs,
        early_stopping_type=tuning.early_stopping,
        warm_start_config=parents,
    ).tune(inputs=inputs(job), job_name=tuning.name, wait=job.wait)


def isolate(boto_session) -> None:
    """EnableNetworkIsolation into the children's definition of the CreateHyperParameterTuningJob request."""

    def add(params, **kwargs):
        params["TrainingJobDefinition"]["EnableNetworkIsolation"] = True

    # registered first: the dry run's handler, which prints the request, runs after it
    boto_session.events.register_first("before-parameter-build.sagemaker.CreateHyperParameterTuningJob", add)
