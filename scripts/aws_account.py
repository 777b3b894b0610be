"""The AWS account the scripts act in, from boto3's default configuration; one line naming what is missing.

Shared by push.py (ECR) and upload_data.py (S3), which call it before any slow step (a build, a download):

    python scripts/aws_account.py          # prints: account 123456789012, region us-east-1
"""

import boto3
from botocore.exceptions import BotoCoreError, ClientError

SETUP = "run `aws configure` (or `aws sso login`), or set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


def account(session: boto3.Session, need_region: bool) -> str:
    """The account id of the session's credentials, asked of STS (so expired or wrong keys fail here, not later).

    Raises SystemExit with one line when credentials or (need_region) the region are missing or refused.
    """
    try:
        credentials = session.get_credentials()
    except BotoCoreError as e:  # e.g. a profile that names no such SSO session
        raise SystemExit(f"error: the AWS credentials cannot be loaded ({e}); {SETUP}") from None
    if credentials is None:
        raise SystemExit(f"error: no AWS credentials found; {SETUP}")
    if need_region and not session.region_name:
        raise SystemExit(
            "error: no AWS region configured; run `aws configure set region us-east-1` (yours), or set AWS_DEFAULT_REGION"
        )
    try:
        return session.client("sts").get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as e:  # expired session, revoked key, no network
        raise SystemExit(f"error: AWS refused or did not answer ({e}); {SETUP}") from None


if __name__ == "__main__":
    session = boto3.Session()
    print(f"account {account(session, need_region=True)}, region {session.region_name}")
