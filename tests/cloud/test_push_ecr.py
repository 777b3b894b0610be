"""`make push`'s AWS side against moto: the ECR repository, Docker's credentials, and the check before any build.

.venv/bin/pytest tests/cloud/test_push_ecr.py -q
"""

import base64
import os
import subprocess
import sys
import time

import boto3
import pytest

import aws_account
import push

pytestmark = pytest.mark.cloud
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUSH = os.path.join(ROOT, "scripts", "push.py")


def test_repository_is_created_when_missing_then_reused(aws):
    ecr = boto3.client("ecr")
    first = push.ecr_repository(ecr, "sagemaker-lightning")
    assert push.ecr_repository(ecr, "sagemaker-lightning") == first
    assert [r["repositoryName"] for r in ecr.describe_repositories()["repositories"]] == ["sagemaker-lightning"]
    account = boto3.client("sts").get_caller_identity()["Account"]  # account and region: the AWS configuration's
    assert first == f"{account}.dkr.ecr.{aws['AWS_DEFAULT_REGION']}.amazonaws.com/sagemaker-lightning"


def test_docker_credentials_come_from_ecrs_authorization_token(aws):
    ecr = boto3.client("ecr")
    authorization = ecr.get_authorization_token()["authorizationData"][0]
    login = push.login_from_token(authorization)
    assert (
        login.registry == push.ecr_repository(ecr, "sagemaker-lightning").split("/")[0]
    )  # logged in where the image goes
    assert login.username == "AWS" and login.password
    assert base64.b64decode(authorization["authorizationToken"]).decode() == f"AWS:{login.password}"


def test_check_names_the_account_and_region(aws):
    proc = subprocess.run([sys.executable, PUSH, "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    account = boto3.client("sts").get_caller_identity()["Account"]
    assert (proc.stdout, proc.stderr) == (
        "",
        f"pushing to ECR: account {account}, region {aws['AWS_DEFAULT_REGION']}\n",
    )


def test_check_without_a_region_is_one_line(aws, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    proc = subprocess.run([sys.executable, PUSH, "--check"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no AWS region configured; ") and proc.stderr.count("\n") == 1, proc.stderr


def test_make_build_push_without_credentials_stops_before_the_build(no_aws, make, tmp_path):
    """One line, in seconds, and no docker command at all; `make build` alone needs no credentials.

    DOCKER is a stand-in that records its calls: a real client would start a multi-GB build if the check failed.
    """
    calls = tmp_path / "docker-calls"
    spy = tmp_path / "docker"
    spy.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    spy.chmod(0o755)

    # "in seconds" relative to this machine: the check's own cost is a Python start with boto3 and push.py imported
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import boto3, push"], cwd=os.path.dirname(PUSH), check=True)
    unavoidable = time.monotonic() - start
    start = time.monotonic()
    proc = make("build", "push", f"DOCKER={spy}", capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 3 * unavoidable + 1, f"{time.monotonic() - start:.1f} s, {unavoidable:.1f} s"
    assert proc.returncode != 0 and not calls.exists(), proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert ours == [f"error: no AWS credentials found; {aws_account.SETUP}"], proc.stderr
    assert proc.stdout == ""

    make("build", f"DOCKER={spy}", capture_output=True, timeout=60)
    assert calls.read_text().startswith("image inspect ")  # without push the build starts: the stand-in sees it
