"""A stand-in for SMDDP's torch_smddp: importing it registers a process-group backend named "smddp".

It is gloo underneath, and refuses ReduceOp.AVG as SMDDP does, so a job that averages anything through
the backend fails here as it would on SageMaker. Put this folder on PYTHONPATH to use it.
"""

import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
)


class RefusesAverage(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self):
        return "smddp"

    @staticmethod
    def _check(opts):
        if opts.reduceOp == dist.ReduceOp.AVG:
            raise RuntimeError("smddp stand-in: ReduceOp.AVG is not supported (SMDDP rejects it); reduce with SUM")

    def allreduce(self, tensors, opts=AllreduceOptions()):
        self._check(opts)
        return self._gloo.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=AllreduceCoalescedOptions()):
        self._check(opts)
        return self._gloo.allreduce_coalesced(tensors, opts)

    def broadcast(self, tensors, opts=BroadcastOptions()):
        return self._gloo.broadcast(tensors, opts)

    def allgather(self, outputs, inputs, opts=AllgatherOptions()):
        return self._gloo.allgather(outputs, inputs, opts)

    def all_gather_single(self, output, input, opts=AllgatherOptions()):
        return self._gloo._allgather_base(output, input, opts)

    def barrier(self, opts=BarrierOptions()):
        return self._gloo.barrier(opts)


dist.Backend.register_backend("smddp", RefusesAverage, devices=["cpu"])
