"""--dry-run: the CreateTrainingJob request printed as JSON, as the API would receive it, and answered here, as is
the DescribeTrainingJob that SDK 3.x sends after it: nothing leaves this machine, no credentials are needed. Both SDK
adapters (sdk2.py, sdk3.py) install it on their boto3 session for a cloud job.

    .venv/bin/python scripts/run_sagemaker.py --dry-run --image <ECR URI> --instance-type ml.g5.xlarge \\
        --role <role ARN> --input s3://bucket/cifar10 --output s3://bucket/jobs > request.json
"""

import json


def intercept(boto_session) -> None:
    """Print the CreateTrainingJob request of `boto_session`'s clients and answer it, and DescribeTrainingJob, here."""
    from botocore.awsrequest import AWSResponse

    def show(params, **kwargs):
        print(json.dumps(params, indent=2, sort_keys=True, default=str))

    def answer(model, params, **kwargs):
        job = {
            "TrainingJobName": "dry-run",
            "TrainingJobArn": "arn:aws:sagemaker:dry-run:000000000000:training-job/dry-run",
        }
        return AWSResponse("https://dry-run", 200, {}, None), {**job, "TrainingJobStatus": "InProgress"}

    boto_session.events.register("before-parameter-build.sagemaker.CreateTrainingJob", show)
    for operation in ("CreateTrainingJob", "DescribeTrainingJob"):
        boto_session.events.register(f"before-call.sagemaker.{operation}", answer)
