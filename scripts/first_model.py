"""How long a newcomer waits for the first trained model: a fresh clone of this repository's HEAD in a temporary
folder, then the README's quick start, each phase timed: `make demo` (the host's SDK installed while the image
builds, as the pypi flavor without Docker's layer cache, as on a machine that holds no image of it yet; then 2
local-mode CPU containers train), `make install` (what the tests add to the host's environments), and the image
rebuilt after a one-line change to app/example/model.py, which must then be in the image: a rebuild that left it out
(a stale layer, a build context without it) would time nothing, and the script fails instead of reporting it.
It prints each phase's seconds, the total from clone to model.tar.gz, the machine, and what was warm: the base image
(pulled or made by `make debian-base` when missing, timed within the image phase) and pip's caches, the host's
(~/.cache/pip) and the build's cache mount, which --no-cache leaves in place (`pip cache purge` and
`docker builder prune --filter type=exec.cachemount` empty them first).

    python scripts/first_model.py            # about 10 minutes on 2 cores; the image is removed afterwards
    python scripts/first_model.py --keep     # keeps the clone and the image, and says where
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE, TAG = "sagemaker-lightning-first-model", "measure"  # not the name a user builds: that one is left alone
PYPI_BASE, DEBIAN_BASE = "python:3.11-slim-bookworm", "sagemaker-lightning-base:bookworm"  # the Makefile's
CHANGED = os.path.join("app", "example", "model.py")  # the file the one-line change is made to, in the clone
IN_IMAGE = "$SAGEMAKER_LIGHTNING_EXAMPLE/model.py"  # its copy in the image, where the image's ENV says the example is


def timed(phases: dict, name: str, command: list[str], cwd: str) -> str:
    """Run `command`, its output to the terminal's stderr as well as kept; record its seconds under `name`."""
    print(f"== {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    phases[name] = time.monotonic() - start
    sys.stderr.write(done.stdout[-3000:])
    if done.returncode != 0:
        raise SystemExit(f"error: {name} failed (exit {done.returncode}) after {phases[name]:.0f} s; its output above")
    return done.stdout


def remove(image: str) -> None:
    """The image and the containers made from it (local mode leaves its containers): both are this script's own."""
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={image}"], capture_output=True, text=True)
    if ids.stdout.split():
        subprocess.run(["docker", "rm", "-f", *ids.stdout.split()], capture_output=True)
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True)


def image_id(image: str) -> str | None:
    found = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def change_missing(changed: str, in_image: subprocess.CompletedProcess) -> str | None:
    """Why the rebuilt image does not hold `changed`, the changed file's content, which `in_image` read (cat of
    IN_IMAGE in a container of the image); None when it does."""
    if in_image.returncode != 0:
        why = (in_image.stderr.strip().splitlines() or ["no output"])[-1]
        return f"error: could not read {IN_IMAGE} from the rebuilt image (exit {in_image.returncode}: {why})"
    if in_image.stdout != changed:
        return (
            f"error: the rebuilt image's {IN_IMAGE} is not the changed {CHANGED}: the rebuild left the change out, "
            "so its time measures nothing; build with the clone's context and without a stale cache"
        )
    return None


def described() -> str:
    docker = subprocess.run(["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True)
    return f"{machine.cpu()}, {len(os.sched_getaffinity(0))} cores; Docker {docker.stdout.strip() or '?'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the clone and the image")
    args = parser.parse_args()
    remove(f"{IMAGE}:{TAG}")  # a kept one of an earlier run
    warm = [b for b in (PYPI_BASE, DEBIAN_BASE) if image_id(b)]
    folder = tempfile.mkdtemp(prefix="first-model-")
    clone, image = os.path.join(folder, "sagemaker-lightning"), [f"IMAGE={IMAGE}", f"TAG={TAG}"]
    phases: dict[str, float] = {}
    try:
        timed(phases, "clone", ["git", "clone", "-q", ROOT, clone], folder)
        output = timed(phases, "demo", ["make", "demo", *image, "BUILD_ARGS=--no-cache"], clone)
        model = next((line for line in output.splitlines() if line.startswith("model.tar.gz: ")), None)
        if model is None:
            raise SystemExit("error: the demo printed no model.tar.gz line; its output above")
        first = image_id(f"{IMAGE}:{TAG}")
        timed(phases, "install", ["make", "install"], clone)
        with open(os.path.join(clone, CHANGED), "a") as f:
            f.write(f"# a one-line change, {uuid.uuid4().hex}\n")  # unique: no earlier image or cache holds it
        with open(os.path.join(clone, CHANGED), encoding="utf-8") as f:
            changed = f.read()
        timed(phases, "rebuild", ["make", "build", "FLAVOR=pypi", *image], clone)
        if image_id(f"{IMAGE}:{TAG}") != first:  # the first build, untagged by the rebuild: 7 GB of nothing
            remove(first)
        read = ["docker", "run", "--rm", "--entrypoint", "sh", f"{IMAGE}:{TAG}", "-c", f'cat "{IN_IMAGE}"']
        if missing := change_missing(changed, subprocess.run(read, capture_output=True, encoding="utf-8")):
            raise SystemExit(missing)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            remove(f"{IMAGE}:{TAG}")
    total = phases["clone"] + phases["demo"]
    print(f"date: {time.strftime('%Y-%m-%d')}; {described()}")
    print(
        f"warm before the run: base image {', '.join(warm) or 'none'}; pip's caches (the host's, the build's) as they were"
    )
    for name, seconds in phases.items():
        print(f"{name:<8} {seconds:7.1f} s")
    print(f"{model}\nfirst model: {total:.0f} s from git clone (clone, demo); rebuild after a one-line change to "
          f"{CHANGED}: {phases['rebuild']:.0f} s, the change in the image")  # fmt: skip
    if args.keep:
        print(f"kept: {clone}, {IMAGE}:{TAG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
