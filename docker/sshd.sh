#!/bin/sh
# Passwordless root SSH between a job's containers, for the MPI runners: mpirun starts the other hosts' ranks
# over ssh. Every host of a job runs this image, so one key pair made at build time lets them in; sshd is
# started by the training toolkit, only for MPI jobs, and listens only on the job's own network.
set -eu
mkdir -p /var/run/sshd /root/.ssh
ssh-keygen -q -t ed25519 -N "" -C "sagemaker-lightning mpi" -f /root/.ssh/id_ed25519
cp /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys
printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n' >> /etc/ssh/ssh_config
# pam_loginuid fails in containers and closes the session
sed -i 's/^session\s*required\s*pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd
