"""`make push` through a real registry (Debian's docker-registry) and back, with a one-file image made here.

.venv/bin/pytest tests/container/test_push_registry.py -q
"""

import base64
import json
import os
import re
import subprocess
import urllib.request
import uuid

import pytest

import push

pytestmark = pytest.mark.container

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def tiny_image(tmp_path):
    """name:tag of a one-file image made with `docker import` (a few KB, unique content); removed afterwards."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "payload").write_bytes(os.urandom(4096))
    ref = f"sagemaker-lightning-push-test:{uuid.uuid4().hex[:12]}"
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    image_id = subprocess.run(
        ["docker", "import", "-", ref], stdin=tar.stdout, capture_output=True, text=True, check=True
    ).stdout.strip()
    tar.wait()
    yield ref
    subprocess.run(
        ["docker", "rmi", "-f", image_id], capture_output=True
    )  # every tag the test gave it, pulled ones too


def registry_get(host: str, path: str, method: str = "GET", auth: tuple[str, str] | None = None):
    request = urllib.request.Request(f"http://{host}/v2/{path}", method=method, headers={"Accept": MANIFEST})
    if auth:
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    return urllib.request.urlopen(request, timeout=10)


def test_make_push_to_a_registry_then_pull_back(registry, tiny_image, no_aws, make, tmp_path, monkeypatch):
    """Both tags land with one digest; what comes back from the registry is the image that was pushed; no AWS."""
    host = registry()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    name, tag = tiny_image.split(":")
    image_id = docker("image", "inspect", "--format", "{{.Id}}", tiny_image)

    proc = make("push", f"IMAGE={name}", f"TAG={tag}", f"REGISTRY={host}", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    match = re.fullmatch(rf"{re.escape(host)}/{name}:({commit}(-dirty)?)\n", proc.stdout)  # stdout: the URI alone
    assert match, proc.stdout
    revision = match.group(1)

    assert sorted(json.load(registry_get(host, f"{name}/tags/list"))["tags"]) == sorted([revision, "latest"])
    digests = {
        t: registry_get(host, f"{name}/manifests/{t}", "HEAD").headers["Docker-Content-Digest"]
        for t in (revision, "latest")
    }
    assert digests[revision] == digests["latest"], digests

    docker("rmi", "-f", image_id)  # the source and its registry tags: the pull must fetch the layer
    assert subprocess.run(["docker", "image", "inspect", image_id], capture_output=True).returncode != 0
    for t in (revision, "latest"):
        docker("pull", "-q", f"{host}/{name}:{t}")
        pulled = json.loads(docker("image", "inspect", "--format", "{{json .}}", f"{host}/{name}:{t}"))
        assert pulled["Id"] == image_id  # the content address of config and layers: the same image
        assert f"{host}/{name}@{digests[t]}" in pulled["RepoDigests"]


def test_ecr_style_login_lets_docker_push_where_credentials_are_required(registry, tiny_image, tmp_path, monkeypatch):
    """push.push logs in with --password-stdin as with ECR's token (user AWS); without it, or with a wrong one, one line."""
    host = registry(users={"AWS": "token-password"})
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    target = f"{host}/sagemaker-lightning"

    with pytest.raises(
        SystemExit, match=rf"^error: docker push {re.escape(target)}:v1: \S"
    ):  # the registry does refuse
        push.push("docker", tiny_image, target, ["v1"], login=None)
    with pytest.raises(
        SystemExit, match=rf"^error: docker login --username AWS --password-stdin {re.escape(host)}: \S"
    ):
        push.push("docker", tiny_image, target, ["v1"], push.Login(host, "AWS", "wrong"))
    push.push("docker", tiny_image, target, ["v1", "latest"], push.Login(host, "AWS", "token-password"))

    listed = json.load(registry_get(host, "sagemaker-lightning/tags/list", auth=("AWS", "token-password")))
    assert sorted(listed["tags"]) == ["latest", "v1"]


def test_revision_is_the_commit_with_dirty_for_uncommitted_files(tmp_path):
    """Untracked files count (they can reach the image); ignored ones do not."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("data/\n")
    (tmp_path / "a.py").write_text("a = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("ignored")
    assert push.revision(str(tmp_path)) == commit
    (tmp_path / "a.py").write_text("a = 2\n")
    assert push.revision(str(tmp_path)) == f"{commit}-dirty"
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "b.py").write_text("")
    assert push.revision(str(tmp_path)) == f"{commit}-dirty"


def test_revision_outside_a_checkout_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: .* is not a git checkout with a commit"):
        push.revision(str(tmp_path))
