"""SDK 2.x's adapter: a job (spec.Job) started as an Estimator(image_uri=...), with a LocalSession for the local
instance types; a tuning job (tuning.Tuning) as a HyperparameterTuner around the same Estimator. The SDK is imported
when a job starts, after every check (spec.make_job, tuning.make_tuning).

    .venv/bin/python scripts/run_sagemaker.py --image sagemaker-lightning:latest --input data/synthetic --output runs

    from jobs import options, sdk2, spec  # from scripts/, with SDK 2.x installed

    model = sdk2.run(spec.make_job(options.parse_args(["--image", "i", "--input", "data", "--output", "runs"])))
"""

import contextlib
import json
import os
import tempfile

from jobs import dry_run
from jobs.spec import CHECKPOINTS, Job
from jobs.tuning import Tuning


def estimator_hyperparameters(hyperparameters: dict[str, str], source_dir: str | None) -> dict:
    """What SDK 2.x's Estimator is given so that it sends `hyperparameters`: with a source_dir it JSON-encodes every
    value itself, so the framework ones (encoded already) go in decoded; an empty custom_mpi_options encoded twice
    reached mpirun as the argument '""', which it took for the program."""
    if not source_dir:
        return hyperparameters
    return {k: json.loads(v) if k.startswith("sagemaker_") else v for k, v in hyperparameters.items()}


def channels(job: Job) -> dict:
    """The job's channels: each S3 prefix with its own input mode (a URI string takes the job's), local ones as they
    are."""
    from sagemaker.inputs import TrainingInput

    return {
        name: TrainingInput(uri, input_mode=job.channel_input_mode) if uri.startswith("s3://") else uri
        for name, uri in job.inputs.items()
    }


def cloud_session(job: Job, *handlers):
    """A Session on a boto3 session of its own, with `handlers` (each given the boto3 session) registered before the
    Session makes its clients, which take the handlers there are then; after them, a dry run's, which prints and
    answers the requests (dry_run.py)."""
    import boto3
    from sagemaker.session import Session

    boto_session = boto3.Session()
    for register in handlers:
        register(boto_session)
    if job.dry_run:
        dry_run.intercept(boto_session)
    return Session(boto_session=boto_session)


def estimator(job: Job, session, output: str):
    """The Estimator that runs `job` (a tuning job's children too); in the cloud with all of the job's settings."""
    from sagemaker.estimator import Estimator  # slow imports: after the argument checks

    cloud = {}
    if not job.local:
        cloud = dict(
            checkpoint_s3_uri=job.checkpoints,
            checkpoint_local_path=CHECKPOINTS,
            metric_definitions=metric_definitions(job),
            use_spot_instances=job.spot,
            max_run=job.max_run,
            max_wait=job.max_wait,
            max_retry_attempts=job.max_retry_attempts,
            keep_alive_period_in_seconds=job.keep_alive,
            enable_network_isolation=job.network_isolation,
            subnets=job.subnets,
            security_group_ids=job.security_groups,
            tags=[{"Key": k, "Value": v} for k, v in job.tags.items()] or None,
            disable_profiler=True,
            debugger_hook_config=False,
        )  # SageMaker Debugger: not for this image
    code = dict(entry_point=job.entry_point, source_dir=job.source_dir) if job.source_dir else {}
    return Estimator(
        **code,
        image_uri=job.image,
        role=job.role,
        instance_count=job.instance_count,
        instance_type=job.instance_type,
        output_path=output,
        hyperparameters=estimator_hyperparameters(job.hyperparameters, job.source_dir),
        environment=job.environment,
        input_mode=job.channel_input_mode,  # every channel's, as TrainingInputMode
        sagemaker_session=session,
        **cloud,
    )


def metric_definitions(job: Job) -> list[dict]:
    return [{"Name": n, "Regex": r} for n, r in job.metrics.items()]


def run(job: Job) -> str | None:
    """Start the job; wait for it unless job.wait is False. Returns the model.tar.gz URI when it waited."""
    from sagemaker.local import LocalSession

    output = job.output
    if job.local:
        session = LocalSession()
        # The SDK leaves each job's container root in the temp dir, a copy of the model in it (107 MB for the example's
        # ResNet-18): ours instead, removed after the job. realpath: Docker Desktop mounts /private/var, not /var (macOS)
        scratch = tempfile.TemporaryDirectory(prefix="sagemaker-local-", ignore_cleanup_errors=True)
        session.config = {"local": {"local_code": True, "container_root": os.path.realpath(scratch.name)}}
        if output.startswith("file://"):
            output = f"{output}/{job.name}"  # local mode writes straight into the path; SageMaker adds the job folder
    else:
        session, scratch = cloud_session(job), contextlib.nullcontext()
    trainer = estimator(job, session, output)
    with scratch:
        trainer.fit(channels(job), job_name=job.name, wait=job.wait, logs="All" if job.wait else "None")
    return trainer.model_data if job.wait else None


def tuner(tuning: Tuning, session):
    """The HyperparameterTuner of `tuning`, around the Estimator its children run."""
    from sagemaker.tuner import (
        CategoricalParameter,
        ContinuousParameter,
        HyperbandStrategyConfig,
        HyperparameterTuner,
        IntegerParameter,
        StrategyConfig,
        WarmStartConfig,
        WarmStartTypes,
    )

    ranges = tuning.sdk_ranges(CategoricalParameter, ContinuousParameter, IntegerParameter)
    job = tuning.job
    hyperband = None
    if tuning.hyperband:
        low, high = tuning.hyperband
        hyperband = StrategyConfig(HyperbandStrategyConfig(min_resource=low, max_resource=high))
    parents = None
    if tuning.warm_start:
        parents = WarmStartConfig(WarmStartTypes.IDENTICAL_DATA_AND_ALGORITHM, set(tuning.warm_start))
    return HyperparameterTuner(
        estimator(job, session, job.output),
        objective_metric_name=tuning.objective,
        objective_type=tuning.objective_type,
        hyperparameter_ranges=ranges,
        metric_definitions=metric_definitions(job),
        strategy=tuning.strategy,
        strategy_config=hyperband,
        max_jobs=tuning.max_jobs,
        max_parallel_jobs=tuning.max_parallel_jobs,
        early_stopping_type=tuning.early_stopping,
        warm_start_config=parents,
    )


def tune(tuning: Tuning) -> None:
    """Create the tuning job; wait for it to end if job.wait."""
    session = cloud_session(tuning.job, *([grid_limits] if tuning.max_jobs is None else []))
    tuner(tuning, session).fit(
        channels(tuning.job), job_name=tuning.name, include_cls_metadata=False, wait=tuning.job.wait
    )


def grid_limits(boto_session) -> None:
    """SDK 2.257.7 sends Grid's unset limit as MaxNumberOfTrainingJobs: null, which botocore refuses ("Parameter
    validation failed"); the API takes none (ResourceLimits needs MaxParallelTrainingJobs only), as SDK 3.x sends it."""

    def drop(params, **kwargs):
        params["HyperParameterTuningJobConfig"]["ResourceLimits"].pop("MaxNumberOfTrainingJobs", None)

    boto_session.events.register("before-parameter-build.sagemaker.CreateHyperParameterTuningJob", drop)
