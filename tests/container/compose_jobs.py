"""The containers of one local-mode job, and their removal (local mode never removes them). A job is known by its
temporary folder: the SDK makes the folders it mounts into the containers (config, model, output) under TMPDIR, so
giving each job a TMPDIR of its own tells its containers from those of another test or another run on the machine."""

import os
import subprocess


def containers(scratch, stopped: bool = False) -> list[str]:
    """The running containers (with `stopped`: all) of the job whose TMPDIR was `scratch`."""
    ids = subprocess.run(["docker", "ps", "-q", *(["-a"] if stopped else [])], capture_output=True, text=True)
    if not ids.stdout.split():
        return []
    mounts = subprocess.run(  # a container that ended meanwhile is left out, and the others still listed
        ["docker", "inspect", "-f", "{{.Id}}{{range .Mounts}} {{.Source}}{{end}}", *ids.stdout.split()],
        capture_output=True,
        text=True,
    )
    inside = os.path.join(str(scratch), "")
    return [
        c[:12]
        for c, *sources in map(str.split, mounts.stdout.splitlines())
        if any(s.startswith(inside) for s in sources)
    ]


def remove_containers(scratch) -> None:
    if ids := containers(scratch, stopped=True):
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
