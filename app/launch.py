"""SAGEMAKER_PROGRAM: sets torch.distributed's variables for the launcher that started it, then runs train.py.

The training toolkit starts this once per host (no distribution), or once per device under torchrun or mpirun
(see sagemaker_env.launcher). It stays the parent of the training process, passes SIGTERM on to it, and
returns its exit code.

    SM_HOSTS='["localhost"]' SM_CURRENT_HOST=localhost python app/launch.py --trainer.max_epochs 1 --data.data_dir data/synthetic
"""

import os
import signal
import socket
import subprocess
import sys

import sagemaker_env
from failure import UserError, report

TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def main() -> int:
    argv = sys.argv[1:]
    try:
        processes = sagemaker_env.devices(os.environ, argv)
        interfaces = {name for _, name in socket.if_nameindex()}
        env = sagemaker_env.launch_env(os.environ, processes, socket.gethostbyname, interfaces, argv)
        command = sagemaker_env.train_command(env, processes, sys.executable, TRAIN_PY, argv)
    except UserError as e:
        return report(str(e))
    if env.get("RANK", "0") == "0":
        mode = (
            "torchrun (c10d)" if command[1:3] == ["-m", "torch.distributed.run"] else sagemaker_env.launcher(os.environ)
        )
        print(
            f"launch: {mode} on {env['SM_HOSTS']}, this is {env['SM_CURRENT_HOST']}, "
            f"world size {env.get('WORLD_SIZE')}, master {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}",
            flush=True,
        )
    child = subprocess.Popen(command, env=env)
    # SIGTERM (from the image's entrypoint) goes to the trainer this started, which checkpoints and stops
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, frame: child.send_signal(received))
    code = child.wait()
    if code == -signal.SIGKILL:
        return report(
            "a training process was killed with SIGKILL, most often by the kernel's out-of-memory killer; "
            "lower data.batch_size or data.num_workers, or use an instance with more memory"
        )
    if code < 0 and code != -signal.SIGTERM:  # SIGTERM: train.py said why (stopped, checkpoint saved)
        return report(f"a training process was killed by {signal.Signals(-code).name}")
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
