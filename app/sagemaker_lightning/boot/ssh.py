"""SSH between the hosts of an MPI job, with keys made when the job starts: the image holds none.

The MPI runners (distribution mpi, pytorchddp, smdistributed) start the other hosts' ranks over SSH as root, and the
training toolkit checks each host by logging in to it. The image's entrypoint (PID 1) prepares that before the
toolkit starts sshd: every host makes its own host key and its own login key, offers both public keys on KEY_PORT,
fetches every other host's, and from then on accepts logins only with the job's hosts' keys, each from its host's
address (authorized_keys), and talks only to hosts whose host key it fetched (known_hosts, checked strictly by the
client settings in ~/.ssh/config, which ssh reads before any ssh_config a base image brings: the first value of a
setting wins). The private keys never leave the host that made them. sshd takes no passwords (docker/sshd.sh).

Public keys need no secrecy, only to come from the right host: a host trusts the network to deliver its peers' keys
at the start of the job (docs/reliability.md says why that is the choice). Nothing secret is served.

    python -c "from sagemaker_lightning.boot import ssh; print(ssh.KEY_PORT)"
"""

import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.hyperparameters import MPI_RUNNERS, enabled

KEY_PORT = 2201  # where each host offers its two public keys while the job runs
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"  # the one host key docker/sshd.sh configures sshd with
MAX_OFFER_BYTES = 4096  # two ed25519 public keys take about 220 bytes: a peer that sends more is not one of ours


def needed(hyperparameters: Mapping) -> bool:
    """Whether the job runs an MPI runner, which starts sshd (SageMaker's framework hyperparameters)."""
    return any(enabled(hyperparameters, key) for key in MPI_RUNNERS)


@dataclass(frozen=True)
class Keys:
    """A host's public keys: the one it logs in with and its host key, one OpenSSH line each."""

    login: str
    host: str

    def text(self) -> str:
        return f"{self.login}\n{self.host}\n"

    @classmethod
    def parse(cls, text: str) -> "Keys":
        lines = text.splitlines()
        if len(lines) != 2 or not all(line.startswith("ssh-ed25519 ") for line in lines):
            raise ValueError(f"not two ssh-ed25519 public keys: {text[:200]!r}")
        return cls(*lines)


def make_keys(ssh_dir: str, host_key: str = HOST_KEY) -> Keys:
    """A new login key (ssh_dir/id_ed25519) and host key, replacing any there were."""
    os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
    for path, comment in ((os.path.join(ssh_dir, "id_ed25519"), "login"), (host_key, "host")):
        for old in (path, f"{path}.pub"):
            if os.path.exists(old):
                os.remove(old)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sagemaker-lightning job {comment}", "-f", path],
            check=True,
        )
    with open(os.path.join(ssh_dir, "id_ed25519.pub")) as login, open(f"{host_key}.pub") as host:
        return Keys(login.read().strip(), host.read().strip())


def serve(keys: Keys, port: int = KEY_PORT) -> socket.socket:
    """Offer `keys` to whoever connects to `port`, from a thread, for as long as this process runs."""
    server = socket.create_server(("", port))

    def run() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed
                return
            with connection:
                connection.sendall(keys.text().encode())

    threading.Thread(target=run, daemon=True).start()
    return server


def receive(connection: socket.socket, deadline: float) -> bytes:
    """What a peer sends until it closes: at most MAX_OFFER_BYTES, by `deadline` (time.monotonic()); else ValueError
    or TimeoutError, however slowly or much it sends."""
    received = b""
    while True:
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = connection.recv(MAX_OFFER_BYTES + 1 - len(received))
        if not chunk:
            return received
        received += chunk
        if len(received) > MAX_OFFER_BYTES:
            raise ValueError(f"it sent more than {MAX_OFFER_BYTES} bytes")
        if time.monotonic() > deadline:
            raise TimeoutError("it did not finish sending in time")


def fetch(address: str, deadline: float, port: int = KEY_PORT) -> Keys:
    """The keys `address` offers, trying until `deadline` (time.monotonic()); OSError or ValueError after it. Each
    try takes at most 5 s, whatever the peer does."""
    while True:
        try:
            attempt = min(deadline, time.monotonic() + 5.0)
            wait = max(1.0, attempt - time.monotonic())
            with socket.create_connection((address, port), timeout=wait) as connection:
                return Keys.parse(receive(connection, max(attempt, time.monotonic() + 1.0)).decode(errors="replace"))
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def authorize(ssh_dir: str, peers: Mapping[str, tuple[str, Keys]]) -> None:
    """Log-ins with the job's hosts' keys only, each from its host's address (authorized_keys, replacing any the image
    or a base image left), and connections to the job's hosts only with the host keys they offered (known_hosts,
    checked strictly: config). peers: host name → (its address, its keys), this host included."""
    known_hosts = os.path.join(ssh_dir, "known_hosts")
    files = {
        "authorized_keys": "".join(f'from="{address}" {keys.login}\n' for address, keys in peers.values()),
        "known_hosts": "".join(f"{name},{address} {keys.host}\n" for name, (address, keys) in peers.items()),
        # the user's file, read before /etc/ssh/ssh_config (where AWS's DLCs write StrictHostKeyChecking no)
        "config": f"Host *\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n",
    }
    for name, text in files.items():
        path = os.path.join(ssh_dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)


def prepare(
    hosts: list[str], current: str, timeout_s: float, ssh_dir: str, host_key: str = HOST_KEY, port: int = KEY_PORT
) -> socket.socket:
    """Keys made, offered on `port` and exchanged with every other host of the job (module docstring). Returns the
    server, which goes on offering this host's keys to hosts that start later."""
    keys = make_keys(ssh_dir, host_key)
    server = serve(keys, port)
    deadline = time.monotonic() + timeout_s
    peers = {}
    for host in hosts:
        address = socket.gethostbyname(host)
        try:
            peers[host] = (address, keys if host == current else fetch(address, deadline, port))
        except (OSError, ValueError) as e:
            server.close()
            raise UserError(
                f"host {host} did not offer its SSH keys on port {port} within dist_timeout={timeout_s:g} s ({e}): "
                "its container did not start the job, or the job's security group blocks traffic between its hosts"
            ) from e
    authorize(ssh_dir, peers)
    return server
