"""PID 1 and what runs at every Python start in the image, before any code of the project; no torch.

entrypoint.py  PID 1: prepares a SageMaker job, runs its command, passes stops on, names a failed command in one line
ssh.py         an MPI job's SSH keys, made at the job's start and exchanged between its hosts
warmpool.py    the warm pool's cache folder: the job's caches there, requirements.txt installed from kept wheels
toolkit.py     the training toolkit's framework module: the PyTorch toolkit's, less its import of torch
autoenv.py     the start-up hook (a .pth file): the launch plan's variables as a plain script's defaults
signals.py     the stop registry: which training processes PID 1 passes a stop on to
"""
