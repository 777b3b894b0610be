"""`run_sagemaker.py best TUNING_JOB`: the tuning job's best child, its objective value and tuned hyperparameters, and
the S3 URI of its model.tar.gz (the README's load snippet reads it as it is: `aws s3 cp <URI> model.tar.gz`). With
warm start, the best of the job and its parents (OverallBestTrainingJob). Two calls, DescribeHyperParameterTuningJob
and DescribeTrainingJob, through boto3 alone: no SDK, and the same on SDK 2.x and 3.x.

    python scripts/run_sagemaker.py best lightning-20250101-120000

    from jobs import best  # from scripts/

    print(best.report(best.find(boto3.client("sagemaker"), "lightning-20250101-120000")))
"""

import argparse


def find(client, name: str) -> dict:
    """The best child's summary (the API's HyperParameterTrainingJobSummary) and its model's URI (ModelS3Uri); a
    SystemExit with one line where there is none yet."""
    tuning = client.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    summary = tuning.get("OverallBestTrainingJob") or tuning.get("BestTrainingJob")
    status = tuning["HyperParameterTuningJobStatus"]
    if not summary:
        raise SystemExit(f"error: tuning job {name} ({status}) has no child with an objective value yet")
    child = client.describe_training_job(TrainingJobName=summary["TrainingJobName"])
    model = child.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if not model:
        raise SystemExit(f"error: the best child {summary['TrainingJobName']} of {name} ({status}) has no model.tar.gz")
    return {**summary, "TuningJobStatus": status, "ModelS3Uri": model}


def report(best: dict) -> str:
    objective = best["FinalHyperParameterTuningJobObjectiveMetric"]
    kind = f" ({objective['Type']})" if objective.get("Type") else ""  # optional in the API's shape
    tuned = " ".join(f"{k}={v}" for k, v in sorted(best["TunedHyperParameters"].items()))
    of = f" of {best['TuningJobName']}" if best.get("TuningJobName") else ""
    return "\n".join(
        [
            f"best child: {best['TrainingJobName']}{of} ({best['TrainingJobStatus']}; tuning job "
            f"{best['TuningJobStatus']})",
            f"objective: {objective['MetricName']} = {objective['Value']:g}{kind}",
            f"hyperparameters: {tuned}",
            f"model.tar.gz: {best['ModelS3Uri']}",
        ]
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="run_sagemaker.py best", description=__doc__.split("\n")[0])
    p.add_argument("tuning_job", metavar="TUNING_JOB", help="the tuning job's name")
    name = p.parse_args(argv).tuning_job
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        print(report(find(boto3.client("sagemaker"), name)))
    except (ClientError, BotoCoreError) as e:
        raise SystemExit(f"error: tuning job {name}: {str(e).strip().splitlines()[0]}") from None
    return 0
