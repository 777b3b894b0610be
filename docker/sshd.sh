#!/bin/sh
# sshd for the MPI runners (mpirun starts the other hosts' ranks over ssh; the toolkit starts sshd only for MPI
# jobs). No key is made here: every host of a job makes its own when the job starts and the hosts exchange their
# public keys (app/sagemaker_lightning/boot/ssh.py), so no copy of the image holds a key that opens any job. Here:
# none left over from the packages (or a base image's own, in this layer), no passwords, the job's keys only.
set -eu
[ -x /usr/sbin/sshd ] || exit 0  # a base image without sshd (a stand-in): nothing to configure
mkdir -p /var/run/sshd /root/.ssh
chmod 700 /root/.ssh
rm -f /etc/ssh/ssh_host_*key* /root/.ssh/id_* /root/.ssh/authorized_keys /root/.ssh/config /root/.ssh/known_hosts
# sshd keeps the first value of each setting: ours go first
{
  printf '# sagemaker-lightning: the job'"'"'s keys only (made at job start), no passwords\n'
  printf 'HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\nPubkeyAuthentication yes\n'
  printf 'AuthenticationMethods publickey\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n'
  printf 'PermitEmptyPasswords no\nAuthorizedKeysFile .ssh/authorized_keys\n\n'
  cat /etc/ssh/sshd_config
} > /tmp/sshd_config && mv /tmp/sshd_config /etc/ssh/sshd_config
# the client's settings (strict host keys) are written by the job into /root/.ssh/config (ssh.py), read before
# /etc/ssh/ssh_config, where a base image may say otherwise
# pam_loginuid fails in containers and closes the session
sed -i 's/^session\s*required\s*pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd
