"""scripts/push.py's pure parts: registry names, repository names, Docker credentials from an ECR token."""

import base64

import pytest

import push

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "registry", ["127.0.0.1:5000", "localhost:5000", "registry.example.com", "ghcr.io/team", "host:5000/a/b-c"]
)
def test_registries_docker_reads(registry):
    assert push.registry_problem(registry) is None


@pytest.mark.parametrize(
    "registry", ["http://127.0.0.1:5000", "127.0.0.1:5000/", "host:port", "host name", "host/Team_"]
)
def test_anything_else_is_named_with_an_example(registry):
    assert (
        push.registry_problem(registry)
        == f"registry {registry!r} is not host[:port][/path]: e.g. REGISTRY=127.0.0.1:5000, without http://"
    )


def test_repository_is_the_image_name_without_its_tag():
    assert push.repository_name("sagemaker-lightning:latest") == "sagemaker-lightning"
    assert push.repository_name("team/app:v1") == "team/app"
    assert push.repository_name("host:5000/app") == "host:5000/app"
    assert push.repository_name("host:5000/app:v1") == "host:5000/app"


def test_login_from_an_ecr_token():
    token = base64.b64encode(b"AWS:pass:with:colons").decode()
    login = push.login_from_token(
        {"authorizationToken": token, "proxyEndpoint": "https://1.dkr.ecr.eu-west-1.amazonaws.com"}
    )
    assert login == push.Login("1.dkr.ecr.eu-west-1.amazonaws.com", "AWS", "pass:with:colons")
