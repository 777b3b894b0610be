"""SSH keys made when an MPI job starts and exchanged between its hosts (real ssh-keygen, a real socket)."""

import os
import socket
import subprocess
import threading
import time

import pytest

from sagemaker_lightning.boot import ssh

pytestmark = pytest.mark.unit


def test_only_mpi_jobs_need_it():
    assert ssh.needed({"sagemaker_mpi_enabled": "true"}) and ssh.needed({"sagemaker_pytorch_ddp_enabled": True})
    assert not ssh.needed({"sagemaker_mpi_enabled": "false"}) and not ssh.needed({"trainer.max_epochs": "1"})


def test_each_job_makes_new_keys(tmp_path):
    first = ssh.make_keys(str(tmp_path / "a"), str(tmp_path / "a-host"))
    again = ssh.make_keys(str(tmp_path / "a"), str(tmp_path / "a-host"))
    assert first != again and first.login != first.host
    assert oct(os.stat(tmp_path / "a" / "id_ed25519").st_mode & 0o777) == "0o600"


def test_hosts_exchange_public_keys_and_accept_only_each_other(tmp_path, free_port):
    """Host algo-1 offers its keys; algo-2 fetches them: each authorizes both login keys and knows both host keys;
    nothing private is ever sent."""
    port = free_port()
    one = ssh.make_keys(str(tmp_path / "one"), str(tmp_path / "one-host"))
    two = ssh.make_keys(str(tmp_path / "two"), str(tmp_path / "two-host"))
    server = ssh.serve(one, port)
    try:
        fetched = ssh.fetch("127.0.0.1", time.monotonic() + 10, port)
    finally:
        server.close()
    assert fetched == one and "PRIVATE" not in one.text()
    ssh.authorize(str(tmp_path / "two"), {"algo-1": ("10.0.0.1", fetched), "algo-2": ("10.0.0.2", two)})
    authorized = (tmp_path / "two" / "authorized_keys").read_text().splitlines()
    assert authorized == [f'from="10.0.0.1" {one.login}', f'from="10.0.0.2" {two.login}']  # each from its host only
    known = (tmp_path / "two" / "known_hosts").read_text().splitlines()
    assert known == [f"algo-1,10.0.0.1 {one.host}", f"algo-2,10.0.0.2 {two.host}"]
    # OpenSSH reads them: the host key of algo-1 is found by name
    found = subprocess.run(["ssh-keygen", "-F", "algo-1", "-f", str(tmp_path / "two" / "known_hosts")],
                           capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 0 and one.host.split()[1] in found.stdout


def test_a_host_that_offers_no_keys_is_named(tmp_path, free_port):
    """Another host whose container never offers its keys (192.0.2.1: TEST-NET, never answers): one line. On a port of
    the test's own: a job of another tier may hold KEY_PORT beside it (make test)."""
    port = free_port()
    with pytest.raises(
        ssh.UserError, match=rf"host 192\.0\.2\.1 did not offer its SSH keys on port {port} within dist_timeout=1 s"
    ):
        ssh.prepare(["localhost", "192.0.2.1"], "localhost", 1, str(tmp_path / "ssh"), str(tmp_path / "host"), port)


@pytest.mark.parametrize("offer", ["much", "slowly"])
def test_a_peer_that_sends_too_much_or_too_slowly_is_cut_off(free_port, offer):
    """The key fetch is bounded in size and in time, whatever answers on the port."""
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))

    def answer(connection):
        with connection:
            try:
                for _ in range(10_000 if offer == "much" else 30):
                    connection.sendall(b"x" * 1000 if offer == "much" else b"x")
                    time.sleep(0 if offer == "much" else 1)
            except OSError:  # cut off
                pass

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    start = time.monotonic()
    with pytest.raises((ValueError, OSError)) as raised, server:
        ssh.fetch("127.0.0.1", time.monotonic() + 1, port)
    assert time.monotonic() - start < 20  # a peer dripping bytes for 30 s does not hold the fetch
    if offer == "much":
        assert "more than 4096 bytes" in str(raised.value)
