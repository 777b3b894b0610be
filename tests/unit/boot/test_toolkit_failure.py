"""What the toolkit or a launcher left when the training program failed, as one line (boot/toolkit_failure.py)."""

import pytest

from sagemaker_lightning.boot.toolkit_failure import toolkit

pytestmark = pytest.mark.unit


# What a real run left (tests/toolkit: torchrun under the toolkit, local rank 1 SIGKILLed; sagemaker-training 5.1.4,
# torch 2.14.1): the toolkit's failure text holds no reason; torchrun's summary is in the log only, and its first
# block is the process torchrun itself ended
TORCHRUN_FAILURE = """ExecuteUserScriptError:
ExitCode 1
ErrorMessage ""
Command "torchrun --nnodes 1 --nproc_per_node 2 train.py --data.batch_size 16 --trainer.devices 2"
"""
TORCHRUN_LOG = """ERROR: lost the connection to host localhost during training: a process there stopped; its failure reason names the cause
W1123 09:54:41.936000 25951 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 25965 closing signal SIGTERM
E1123 09:54:42.000000 25951 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 25966) of binary: /work/main/.venv/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
train.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_09:54:42
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 25965)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 25965
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_09:54:41
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 25966)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 25966
=======================================================
"""


def test_a_rank_that_torchrun_saw_killed_is_named_from_the_log():
    line = toolkit(TORCHRUN_FAILURE, "algo-2", "/nonexistent", TORCHRUN_LOG)
    assert line.startswith("training process rank 1 (local rank 1) on host algo-2 was killed with SIGKILL, most often")
