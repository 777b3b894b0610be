"""The no-line way: a plain Lightning script, unchanged for SageMaker. Its Trainer() spans the job's hosts because
the image sets Lightning's PL_TRAINER_NUM_NODES, PL_TRAINER_DEVICES and the rank variables; its checkpoints and logs
go under the default root, which the image points at SageMaker's output directory. It reads its data channel itself.

    python plain.py --epochs 2 --root data/points
"""

import argparse
import hashlib
import os

import lightning.pytorch as L
from classifier import Classifier
from points import Points


class SayWeights(L.Callback):
    def on_train_end(self, trainer, pl_module):
        digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in pl_module.state_dict().values()))
        print(f"plain rank {trainer.global_rank}/{trainer.world_size}: weights {digest.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--root", default=os.environ.get("SM_CHANNEL_TRAINING", "data/points"))
    args, _ = parser.parse_known_args()
    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=args.epochs, enable_progress_bar=False, callbacks=[SayWeights()])
    trainer.fit(Classifier(), Points(args.root))
