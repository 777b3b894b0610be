"""The job's log as it passes, watched for each epoch's validation accuracy: what the closing line of
scripts/run_sagemaker.py says the job's model reached.

    from jobs.watch import ValidationWatch  # from scripts/

    watch = ValidationWatch(sys.stdout)
    with contextlib.redirect_stdout(watch):
        ...  # start the job and stream its log
    print(watch.summary())  # final validation accuracy: 0.8500 (epoch 2; best 0.9000 at epoch 1)
"""

import re

from sagemaker_lightning.lines import METRICS


class ValidationWatch:
    """Standard output that also keeps each epoch's validation accuracy from the job's log as it passes, read from the
    trainer's `epoch E step S: ... val/acc=A` lines (the runtime's RankReport) with the metric definition's regex,
    as SageMaker reads it into CloudWatch. Both SDKs write a job's log through sys.stdout, in local mode and in the
    cloud."""

    LINE = re.compile(r"epoch (\d+) step \d+: .*?" + METRICS["validation:accuracy"])

    def __init__(self, stream):
        self.stream, self.accuracy, self._partial = stream, {}, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if match := self.LINE.search(line):
                self.accuracy[int(match.group(1))] = float(match.group(2))
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)

    def summary(self) -> str:
        last, best = max(self.accuracy), max(self.accuracy, key=self.accuracy.get)
        return (
            f"final validation accuracy: {self.accuracy[last]:.4f} (epoch {last}; "
            f"best {self.accuracy[best]:.4f} at epoch {best})"
        )
