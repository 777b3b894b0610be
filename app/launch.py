"""SAGEMAKER_PROGRAM: turns SageMaker's host list into torch.distributed settings, then runs train.py.

The training toolkit starts this once per host (`train` → `python launch.py --key value ...`). It sets
MASTER_ADDR, MASTER_PORT, NODE_RANK and WORLD_SIZE from SM_HOSTS/SM_CURRENT_HOST, and Lightning starts one
training process per device from there.

    SM_HOSTS='["localhost"]' SM_CURRENT_HOST=localhost python app/launch.py --trainer.max_epochs 1 --data.data_dir data/synthetic
"""

import os
import socket
import subprocess
import sys

import sagemaker_env
from failure import UserError, report

TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def main() -> int:
    argv = sys.argv[1:]
    try:
        env = sagemaker_env.launch_env(
            os.environ,
            sagemaker_env.devices(os.environ, argv),
            resolve=socket.gethostbyname,
            interfaces={name for _, name in socket.if_nameindex()},
        )
    except UserError as e:
        return report(str(e))
    print(
        f"launch: node {env['NODE_RANK']} of {env['SM_HOSTS']}, world size {env['WORLD_SIZE']}, "
        f"master {env['MASTER_ADDR']}:{env['MASTER_PORT']}",
        flush=True,
    )
    return subprocess.call([sys.executable, TRAIN_PY, *argv], env=env)


if __name__ == "__main__":
    sys.exit(main())
