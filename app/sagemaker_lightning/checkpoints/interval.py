"""When last.ckpt is due by steps (LastCheckpoint asks at every step): every N optimizer steps as
last_checkpoint_every_n_steps says, not by steps at all (0: epoch ends and SIGTERM only), or, where a stop's SIGTERM
cannot reach the training processes, about every AUTO_INTERVAL_S of training, the steps counted from the measured step
time; and the line that then says what bounds a stop's loss. No trainer and no torch: the caller gives each step's
clock and the ranks' agreement (a broadcast of rank 0's interval).

    python -c "from sagemaker_lightning.checkpoints.interval import Interval; i = Interval(None, 'PID 1 is bash'); [i.measure(s, s / 2, int) for s in range(5)]; print(i.line(measured=True))"
"""

from collections.abc import Callable

from sagemaker_lightning.failure import UserError

AUTO_INTERVAL_S = 60  # where no SIGTERM arrives: last.ckpt about this often, so a stop loses about a minute at most
MEASURED_STEPS = 3  # steps timed (after the first, which compiles and warms up) to choose that interval


def interval_steps(seconds_per_step: float, target_s: float = AUTO_INTERVAL_S) -> int:
    """Optimizer steps in about `target_s` seconds of training, at least 1."""
    return max(1, round(target_s / max(seconds_per_step, 1e-9)))


class Interval:
    """last.ckpt's interval in optimizer steps, `steps`: N, 0 (not by steps) or None (not measured yet)."""

    def __init__(self, every_n_steps: int | None, unprotected: str | None):
        """every_n_steps: the setting (None: 0, or measured where `unprotected`); unprotected: why a stop's SIGTERM
        cannot reach the training processes, None where it can."""
        if every_n_steps is not None and every_n_steps < 0:  # `step % -1 == 0` would save at every step
            raise UserError(
                f"last_checkpoint_every_n_steps={every_n_steps} is not a number of steps: give N > 0 for last.ckpt "
                "every N steps, 0 for epoch ends and SIGTERM only, or null for the runtime's choice"
            )
        self.steps = every_n_steps if every_n_steps is not None or unprotected else 0
        self.unprotected = unprotected
        self._timing = None  # (first step timed, its clock) while the interval is being measured

    def due(self, step: int) -> bool:
        """Whether last.ckpt is due at `step` by steps."""
        return bool(self.steps) and step % self.steps == 0

    def measure(self, step: int, now: float, agreed: Callable[[int], int]) -> bool:
        """At each step while `steps` is None (`now`: this rank's clock): MEASURED_STEPS steps after the first timed,
        `steps` is set to what `agreed` makes of this rank's interval (rank 0's on every rank); True at that step."""
        if self._timing is None:
            self._timing = (step, now)
            return False
        first, then = self._timing
        if step - first < MEASURED_STEPS:
            return False
        self.steps = agreed(interval_steps((now - then) / (step - first)))
        return True

    def line(self, measured: bool = False) -> str | None:
        """What rank 0 says where a stop's SIGTERM cannot reach the training processes: what bounds the loss, the
        interval as set, or as just `measured`; None where SIGTERM reaches them or the interval is not measured yet."""
        if not self.unprotected or self.steps is None:
            return None
        bound = f"last.ckpt every {self.steps} steps" if self.steps else "last.ckpt at each epoch's end"
        if measured:
            bound += f" (about {AUTO_INTERVAL_S} s of training)"
        return (
            f"no SIGTERM reaches the training processes ({self.unprotected}): a stop (spot interruption, "
            f"StopTrainingJob, a pod's deletion) loses what was trained since the last checkpoint; {bound} bounds it "
            "(last_checkpoint_every_n_steps sets another interval)"
        )
