"""--dry-run: the CreateTrainingJob request (with `tune`, CreateHyperParameterTuningJob) printed as JSON, as the API
would receive it, and answered here, as is the Describe call that SDK 3.x sends after it: nothing leaves this machine,
no credentials are needed. With
--source-dir the SDK packs the code and uploads it (to its default bucket, which it finds through STS): each upload is
printed on stderr (`dry run: would upload s3://...`) and answered here too, as are its S3 and STS calls. Both SDK
adapters (sdk2.py, sdk3.py) install it on their boto3 session for a cloud job, before the SDK makes its clients.

    .venv/bin/python scripts/run_sagemaker.py --dry-run --image <ECR URI> --instance-type ml.g5.xlarge \\
        --role <role ARN> --input s3://bucket/cifar10 --output s3://bucket/jobs > request.json
"""

import json
import sys

ACCOUNT = "000000000000"  # the account a dry run answers STS with: the default bucket's name carries it
JOBS = {"Training": "training-job", "HyperParameterTuning": "hyper-parameter-tuning-job"}  # kind: its ARN's word
ANSWERS = {  # what S3 and STS answer a dry run's calls with ({} for the others: HeadBucket, PutObject, ...)
    "GetCallerIdentity": {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/dry-run", "UserId": "dry-run"},
    "CreateMultipartUpload": {"UploadId": "dry-run"},
    "UploadPart": {"ETag": '"dry-run"'},
    "ListBuckets": {"Buckets": []},  # so the SDK "creates" its default bucket, answered here too
}


def intercept(boto_session) -> None:
    """Print the Create request of `boto_session`'s clients and answer it, and its Describe, here."""
    from botocore.awsrequest import AWSResponse

    def show(params, **kwargs):
        print(json.dumps(params, indent=2, sort_keys=True, default=str))

    def answer(model, params, **kwargs):
        kind = "HyperParameterTuning" if "HyperParameterTuning" in model.name else "Training"
        job = {
            f"{kind}JobName": "dry-run",
            f"{kind}JobArn": f"arn:aws:sagemaker:dry-run:{ACCOUNT}:{JOBS[kind]}/dry-run",
            f"{kind}JobStatus": "InProgress",
        }
        return AWSResponse("https://dry-run", 200, {}, None), job

    def upload(params, **kwargs):
        print(f"dry run: would upload s3://{params['Bucket']}/{params['Key']}", file=sys.stderr)

    def elsewhere(model, params, **kwargs):
        return AWSResponse("https://dry-run", 200, {}, None), ANSWERS.get(model.name, {})

    for kind in JOBS:
        boto_session.events.register(f"before-parameter-build.sagemaker.Create{kind}Job", show)
        for operation in (f"Create{kind}Job", f"Describe{kind}Job"):
            boto_session.events.register(f"before-call.sagemaker.{operation}", answer)
    for operation in ("PutObject", "CreateMultipartUpload"):
        boto_session.events.register(f"before-parameter-build.s3.{operation}", upload)
    for service in ("s3", "sts"):
        boto_session.events.register(f"before-call.{service}", elsewhere)
