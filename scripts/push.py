"""Push a local image to ECR, or to any other registry, as <git revision> and `latest`; print the image URI.

To ECR (account and region from the AWS configuration): the repository, named as the image, is created when
missing, and Docker logs in with ECR's authorization token, as `aws ecr get-login-password | docker login` does.
To another registry: no AWS call at all; log Docker in to it yourself when it needs credentials. `make push` runs
this; `make build push` runs --check first, so missing AWS settings stop it before the build. Docker's output goes
to stderr: stdout is the URI alone.

    python scripts/push.py sagemaker-lightning:latest                             # to ECR
    python scripts/push.py sagemaker-lightning:latest --registry 127.0.0.1:5000   # to another registry
    python scripts/push.py --check                                                # only the AWS configuration
"""

import argparse
import base64
import os
import re
import subprocess
import sys
from typing import NamedTuple

import boto3
from botocore.exceptions import BotoCoreError, ClientError

import aws_account

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What Docker reads as the registry part of a reference: host[:port], then optional path components
REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*", re.IGNORECASE)


class Login(NamedTuple):
    registry: str
    username: str
    password: str


def login_from_token(authorization: dict) -> Login:
    """Docker credentials from an item of ECR's GetAuthorizationToken: the token is base64 of 'user:password'."""
    username, _, password = base64.b64decode(authorization["authorizationToken"]).decode().partition(":")
    return Login(authorization["proxyEndpoint"].removeprefix("https://"), username, password)


def ecr_repository(ecr, name: str) -> str:
    """The URI of the ECR repository `name`, created when missing."""
    try:
        return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]["repositoryUri"]
    except ecr.exceptions.RepositoryNotFoundException:
        return ecr.create_repository(repositoryName=name)["repository"]["repositoryUri"]


def registry_problem(registry: str) -> str | None:
    if REGISTRY.fullmatch(registry):
        return None
    return f"registry {registry!r} is not host[:port][/path]: e.g. REGISTRY=127.0.0.1:5000, without http://"


def repository_name(image: str) -> str:
    """'name:tag' → 'name'; a port is not a tag ('host:5000/name' stays whole)."""
    name, sep, tag = image.rpartition(":")
    return name if sep and "/" not in tag else image


def revision(root: str) -> str:
    """The checkout's short commit, with -dirty when files differ from it (untracked ones too: they can reach the image)."""
    git = ["git", "-C", root]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if commit.returncode:
        raise SystemExit(
            f"error: {root} is not a git checkout with a commit ({commit.stderr.strip()}); the tag is the revision"
        )
    changes = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    return commit.stdout.strip() + ("-dirty" if changes.strip() else "")


def docker(client: str, *args: str, stdin: str | None = None, stream: bool = False, hint: str = "") -> None:
    """Run `docker ARGS`; stream: show its output (on stderr) as it comes. One line, its last error, on failure."""
    proc = subprocess.run(
        [client, *args],
        input=stdin,
        text=True,
        stdout=sys.stderr if stream else subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if proc.returncode:
        last = (proc.stderr.strip() or proc.stdout or "").strip().splitlines()[-1:] or [
            f"exit status {proc.returncode}"
        ]
        raise SystemExit(f"error: docker {' '.join(args)}: {last[0]}{hint}")


def push(client: str, image: str, target: str, tags: list[str], login: Login | None) -> None:
    """Log in (when given credentials), then tag `image` as target:tag and push, for each tag."""
    if login:
        docker(client, "login", "--username", login.username, "--password-stdin", login.registry, stdin=login.password)
    for tag in tags:
        docker(client, "tag", image, f"{target}:{tag}")
        docker(client, "push", f"{target}:{tag}", stream=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("image", nargs="?", help="the local image, name:tag (its name names the repository)")
    parser.add_argument("--registry", help="host[:port][/path] of a registry other than ECR")
    parser.add_argument(
        "--check", action="store_true", help="only check that the push can start (AWS credentials, region)"
    )
    parser.add_argument("--docker", default="docker", help="the docker client")
    args = parser.parse_args()
    if not args.check and not args.image:
        parser.error("name the image to push, e.g. sagemaker-lightning:latest")
    if args.registry:
        problem = registry_problem(args.registry)
        if problem:
            raise SystemExit(f"error: {problem}")
    else:  # before any ECR call, and before the build with `make build push`
        session = boto3.Session()
        account = aws_account.account(session, need_region=True)
        if args.check:  # where the image will go, said before a long build
            print(f"pushing to ECR: account {account}, region {session.region_name}", file=sys.stderr)
    if args.check:
        return 0

    docker(args.docker, "image", "inspect", args.image, hint="; build it first (make build), or set IMAGE and TAG")
    tags = [revision(ROOT), "latest"]
    name = repository_name(args.image)
    if args.registry:
        target, login = f"{args.registry}/{name}", None
    else:
        ecr = session.client("ecr")
        try:
            target = ecr_repository(ecr, name)
            login = login_from_token(ecr.get_authorization_token()["authorizationData"][0])
        except (BotoCoreError, ClientError) as e:  # e.g. no ecr:CreateRepository permission
            raise SystemExit(f"error: ECR: {e}") from None
    push(args.docker, args.image, target, tags, login)
    print(f"{target}:{tags[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
