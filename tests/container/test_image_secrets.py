"""No secret in the image: every file of every layer (`docker save`, read once for the module: the save of the ~7 GB
image is most of the time) holds no credentials, no byte of the build's CA bundle and no private key; sshd takes
the job's keys only, and ssh checks host keys whatever the base image says.

    TEST_IMAGE=sagemaker-lightning:mine .venv/bin/pytest tests/container/test_image_secrets.py
"""

import fnmatch
import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

pytestmark = pytest.mark.container

# a private key with its key material (not a mention of the marker, not a placeholder as in botocore's examples)
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[A-Za-z0-9+/=:,\s-]{64,}?-----END ")
# keys a package ships for its own test suite: published with its source, they open nothing
TEST_FIXTURES = ("opt/venv/lib/python3.11/site-packages/gevent/tests/",)
CREDENTIAL_NAMES = {".aws", ".git", "credentials", ".netrc"}  # files or folders, anywhere
AWS_KEY = re.compile(rb"AKIA[0-9A-Z]{16}")
AWS_KEY_DIRS = ("opt/ml/", "root/", "etc/", "tmp/", "usr/local/bin/")  # where a job's or a build's keys would land
CHUNK = 1 << 20


@dataclass
class Scan:
    """What one pass over every file of every layer found."""

    layers: int = 0
    unread: list[str] = field(default_factory=list)  # docker save's members that are no tar (checked against manifest)
    manifest: list = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # files with a private key
    fixtures: list[str] = field(default_factory=list)  # the same, in a package's test suite (TEST_FIXTURES)
    named: list[str] = field(default_factory=list)  # CREDENTIAL_NAMES, and *.pem under a root/ folder
    marked: list[str] = field(default_factory=list)  # files holding the build's CA bundle marker
    aws_keys: list[str] = field(default_factory=list)  # files under AWS_KEY_DIRS holding an AWS access key id


def layers(saved, scan: Scan) -> Iterator[tarfile.TarFile]:
    """Each layer of an image in `docker save`'s stream, as an open tar stream; the names of the files that are no tar
    go to scan.unread (an image configuration, the manifest, or a layer that could not be read: the test checks them
    against scan.manifest, which gets manifest.json's entries)."""
    with tarfile.open(fileobj=saved, mode="r|") as outer:
        for blob in outer:
            if blob.name == "manifest.json":
                scan.manifest += json.load(outer.extractfile(blob))
            elif blob.isfile():
                try:
                    with tarfile.open(fileobj=outer.extractfile(blob), mode="r|*") as layer:
                        yield layer
                except tarfile.ReadError:
                    scan.unread.append(blob.name)


def holds(data, marker: bytes, aws: bool) -> tuple[bool, bool, bytes]:
    """(the marker, an AWS key id) in a file's content, read in chunks that overlap by a match's length; and its first
    64 KiB (keys are small files)."""
    marked = found_key = False
    head, tail = b"", b""
    while chunk := data.read(CHUNK):
        head = head or chunk[: 1 << 16]
        window = tail + chunk
        marked = marked or marker in window
        found_key = found_key or (aws and AWS_KEY.search(window) is not None)
        tail = window[-max(len(marker), 20) :]
    return marked, found_key, head


@pytest.fixture(scope="module")
def scan(image, build_marker) -> Scan:
    """Every file of every layer of the image (a later layer's deletions notwithstanding), read once."""
    found, marker = Scan(), build_marker.encode()
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    for layer in layers(save.stdout, found):
        found.layers += 1
        for member in layer:
            name = member.name.removeprefix("./")
            if name.rsplit("/", 1)[-1] in CREDENTIAL_NAMES or fnmatch.fnmatch(f"/{name}", "*/root/*.pem"):
                found.named.append(name)
            if not member.isfile():
                continue
            marked, aws_key, head = holds(layer.extractfile(member), marker, name.startswith(AWS_KEY_DIRS))
            found.marked += [name] if marked else []
            found.aws_keys += [name] if aws_key else []
            if 0 < member.size <= 1 << 16 and PRIVATE_KEY.search(head):
                (found.fixtures if name.startswith(TEST_FIXTURES) else found.keys).append(name)
    assert save.wait() == 0
    return found


def test_the_image_holds_no_credentials(image, build_marker, scan):
    """No AWS keys, no .aws, .git or credentials files, and not a byte of the CA bundle mounted at build time
    (it carries a marker line; see the image fixture), in any layer, nor in the image's history or config."""
    assert scan.named == [] and scan.aws_keys == [], (scan.named, scan.aws_keys)
    assert scan.marked == [], scan.marked
    history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, text=True).stdout
    config = subprocess.run(["docker", "inspect", image], capture_output=True, text=True).stdout
    assert build_marker not in history + config and "BEGIN CERTIFICATE" not in history + config
    assert not re.search(r"AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)", config)


def test_no_private_key_in_any_layer(scan):
    """Every file of every layer of the image (docker save), a later layer's deletions notwithstanding: no private
    key of any kind (SSH, TLS), so no copy of the image opens anything. sshd's keys are made when a job starts."""
    assert scan.layers > 3
    (image_manifest,) = scan.manifest
    assert scan.layers == len(set(image_manifest["Layers"]))  # each layer read
    assert not set(scan.unread) & set(image_manifest["Layers"])
    assert scan.keys == [], scan.keys
    assert scan.fixtures  # the scan finds keys where there are some


def test_sshd_takes_the_jobs_keys_only(image):
    """sshd (for MPI jobs) accepts public keys only: no passwords, no keyboard-interactive, root by key only."""
    show = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", image, "-c",
         "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key && /usr/sbin/sshd -T"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert show.returncode == 0, show.stderr
    settings = dict(line.split(" ", 1) for line in show.stdout.splitlines() if " " in line)
    assert settings["passwordauthentication"] == "no" and settings["kbdinteractiveauthentication"] == "no"
    assert settings["authenticationmethods"] == "publickey"
    assert settings["permitrootlogin"] == "without-password"  # sshd -T's name for prohibit-password
    assert settings["hostkey"] == "/etc/ssh/ssh_host_ed25519_key"
    # no key of the build's left in the image: every host makes its own when a job starts (ssh.py)
    script = "for f in /etc/ssh/ssh_host_* /root/.ssh/id_* /root/.ssh/authorized_keys; do [ -e $f ] && echo $f; done"
    leftovers = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", f"{script}; echo scanned"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert leftovers.stdout.split() == ["scanned"], leftovers.stdout


def test_host_keys_are_checked_whatever_the_base_image_says(image):
    """A stand-in for AWS's DLC bases, whose /etc/ssh/ssh_config says `StrictHostKeyChecking no` before anything
    appended to it (ssh keeps a setting's first value): once the job's keys are exchanged, `ssh -G` shows the job's
    settings in force (ssh.py writes them to ~/.ssh/config, read before ssh_config)."""
    script = (
        "printf 'Host *\\n  StrictHostKeyChecking no\\n' | cat - /etc/ssh/ssh_config > /tmp/c && "
        "cp /tmp/c /etc/ssh/ssh_config && ssh -G algo-2 | grep -i stricthostkeychecking && "
        'python3 -c \'from sagemaker_lightning.boot import ssh; k = ssh.make_keys("/root/.ssh", "/tmp/host"); '
        'ssh.authorize("/root/.ssh", {"algo-2": ("10.0.0.2", k)})\' && echo exchanged && ssh -G algo-2'
    )
    shown = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", image, "-c", script], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    before, after = shown.stdout.split("exchanged\n")
    assert before.strip() == "stricthostkeychecking false"  # the stand-in base's setting holds at first
    settings = dict(line.split(" ", 1) for line in after.splitlines() if " " in line)
    assert settings["stricthostkeychecking"] == "true"
    assert settings["userknownhostsfile"] == "/root/.ssh/known_hosts"
    assert settings["globalknownhostsfile"] == "/dev/null"
