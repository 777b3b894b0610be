"""What the runtime does at every training step, kept cheap (scripts/bench_overhead.py measures it) without losing
what it is for: the stop agreement (stop.StopTogether) between two real gloo processes, the per-batch seeding
(loader.seed_all), and the hooks Lightning need not call (flavor.made).

    .venv/bin/pytest tests/unit/test_per_step.py
"""

import datetime
import itertools
import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pytorch_lightning.utilities.exceptions import SIGTERMException

from sagemaker_lightning import flavor
from sagemaker_lightning.checkpoints import loader
from sagemaker_lightning.progress import LogLines
from sagemaker_lightning.stop import StopTogether

pytestmark = pytest.mark.unit

CALLS = 10  # hook calls of each rank: the signal comes before one call of rank 1 only
SIGNALLED = (0, 3, CALLS - 1)  # the first step or batch, one between two agreements, the last
PACE = (0.08, 0.04)  # each rank's seconds per training step (its StopTogether's clock)
# Training steps that agree: the first, then every (3 + 6) // 2 = 4 steps, the mean of what each rank's pace
# proposes for StopTogether.AGREE_EVERY_S (0.25 s: 3.125 and 6.25 steps)
AGREED = (0, 1, 5, 9)


def agreeing(rank: int, port: int, out) -> None:
    """One rank: for each signalled call, StopTogether on a trainer of its parts, `CALLS` training steps, then anew
    `CALLS` validation batches; whether it had stopped after each goes to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    strategy = pytorch_lightning.strategies.DDPStrategy(
        accelerator=pytorch_lightning.accelerators.CPUAccelerator(), parallel_devices=[torch.device("cpu")] * 2
    )
    strategy._launcher = None
    decided = {}
    for signalled, mode in itertools.product(SIGNALLED, ("training", "validation")):
        trainer = SimpleNamespace(
            world_size=2,
            strategy=strategy,
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()),
            _signal_connector=SimpleNamespace(received_sigterm=False, _sigterm_notifier_fn=None),
        )
        stop = flavor.made(StopTogether, pytorch_lightning)()
        stop.clock = lambda: call * PACE[rank]  # noqa: B023 (the call under way)
        stop.setup(trainer, None, "fit")
        decided[signalled, mode] = []
        for call in range(CALLS):
            if rank == 1 and call == signalled:
                trainer._signal_connector._sigterm_notifier_fn(15, None)  # the SIGTERM handler
            if mode == "validation":
                stop.on_validation_batch_end(trainer, None, None, None, call)
            else:
                try:
                    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()  # where Lightning calls it: before a step
                except SIGTERMException:
                    assert trainer._signal_connector.received_sigterm
            decided[signalled, mode].append(trainer._signal_connector.received_sigterm)
    out.put((rank, decided))
    dist.destroy_process_group()


def test_ranks_stop_together_at_the_step_or_validation_batch_the_signal_came_in(free_port):
    """Training: in place of Lightning's own collective before each step, both ranks stop (SIGTERMException, which
    saves last.ckpt) before the same step: the first agreed one after the signal, though the ranks go at different
    paces. Validation: after each batch, so a long validation ends after the batch the signal came in. The signal at
    the first call, between two agreements, and at the last."""
    port = free_port()
    context = mp.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=agreeing, args=(rank, port, out)) for rank in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    expected = {}
    for n in SIGNALLED:
        expected[n, "validation"] = [call >= n for call in range(CALLS)]
        expected[n, "training"] = [call >= min(a for a in AGREED if a >= n) for call in range(CALLS)]
    assert results == {0: expected, 1: expected}


@pytest.mark.parametrize(("seconds_per_step", "agreed"), [(1e-6, [0, 1, 101, 201]), (0.0, [0, 1, 101, 201])])
def test_agreements_are_at_most_most_steps_apart(seconds_per_step, agreed):
    """A pace too fast to time (a microsecond a step, or a clock that does not move) proposes more steps than
    MOST_STEPS: the next agreement comes after MOST_STEPS steps, so a stop after a pace that drops (a data stall)
    waits that many steps at most. The agreement itself (one all-reduce) is left out: each rank proposes alone."""
    trainer = SimpleNamespace(
        world_size=2,
        strategy=SimpleNamespace(launcher=None),
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()),
        _signal_connector=SimpleNamespace(received_sigterm=False, _sigterm_notifier_fn=None),
    )
    stop = flavor.made(StopTogether, pytorch_lightning)()
    stop.clock = lambda: step * seconds_per_step  # noqa: B023 (the step under way)
    calls = []
    stop.agree = lambda trainer, proposal: calls.append(step) or proposal  # noqa: B023
    stop.setup(trainer, None, "fit")
    for step in range(250):  # noqa: B007 (the clock and agree read it)
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert calls == agreed and StopTogether.MOST_STEPS == 100


def draws() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_seed_all_makes_each_generator_repeat_its_draws():
    loader.seed_all(hash((0, 1, 2)))
    first = draws()
    loader.seed_all(hash((0, 1, 3)))
    other = draws()
    loader.seed_all(hash((0, 1, 2)))
    assert draws() == first
    assert all(a != b for a, b in zip(first, other, strict=True))  # each of torch's, numpy's and Python's was reseeded


def test_callbacks_leave_out_the_hooks_they_do_not_define():
    """Lightning calls each hook of each callback at every step unless it is None; the hooks a callback defines, and
    those Lightning calls without that check, stay."""
    made = flavor.made(LogLines, pytorch_lightning)()
    assert made.on_before_backward is None and made.on_validation_batch_end is None
    assert callable(made.on_train_batch_end) and callable(made.on_train_start)
    assert callable(made.on_save_checkpoint) and callable(made.on_load_checkpoint) and callable(made.state_dict)
