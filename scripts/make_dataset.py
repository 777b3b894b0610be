"""Write CIFAR-10-format data: a learnable synthetic set of any size (demo, tests), real handwritten digits that
scikit-learn ships, or the real CIFAR-10.

The synthetic images are class patterns (a colour and a stripe direction per class) plus noise, so a small
network learns them in an epoch. The digits are scikit-learn's load_digits (1,797 real 8×8 scans of handwritten
digits, the UCI "optdigits" test set, inside the package: nothing is downloaded), upscaled. Every set is written
in the official format (pickled batches, batches.meta) and packed as the official archive, which is what users
upload to S3.

    python scripts/make_dataset.py synthetic data/synthetic --train 2000 --test 500
    python scripts/make_dataset.py digits data/digits            # 1,437 training and 360 test images
    python scripts/make_dataset.py cifar10 data/cifar10          # downloads; needs internet
"""

import argparse
import io
import os
import pickle
import sys
import tarfile

import numpy as np

FOLDER = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def synthetic_images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """n images (n×3072 uint8, channel planes as in CIFAR-10) and their labels."""
    labels = rng.integers(0, len(CLASSES), n)
    yy, xx = np.mgrid[0:32, 0:32] / 32.0
    angles = np.linspace(0, np.pi, len(CLASSES), endpoint=False)
    colours = np.random.default_rng(0).uniform(0.2, 0.8, (len(CLASSES), 3))  # fixed per class, whatever the seed
    stripes = np.sin(2 * np.pi * 4 * (np.cos(angles)[:, None, None] * xx + np.sin(angles)[:, None, None] * yy))
    images = colours[labels][:, :, None, None] + 0.25 * stripes[labels][:, None] + rng.normal(0, 0.15, (n, 3, 32, 32))
    pixels = np.clip(images * 255, 0, 255).astype(np.uint8)
    return pixels.reshape(n, 3072), labels.tolist()


def batch(name: str, data: np.ndarray, labels: list[int]) -> bytes:
    return pickle.dumps(
        {
            "batch_label": name,
            "labels": labels,
            "data": data,
            "filenames": [f"{name}_{i}.png" for i in range(len(labels))],
        }
    )


def write_archive(out: str, files: dict[str, bytes]) -> str:
    """Pack {file name: bytes} as cifar-10-python.tar.gz with the official cifar-10-batches-py/ folder."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, ARCHIVE)
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{FOLDER}/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def cifar_files(train: tuple[np.ndarray, list[int]], test: tuple[np.ndarray, list[int]], names: list[str]) -> dict:
    """{file name: bytes} of the official layout: the training images in 5 data batches, then the test batch."""
    data, labels = train
    files = {
        "batches.meta": pickle.dumps(
            {"label_names": names, "num_cases_per_batch": -(-len(labels) // 5), "num_vis": 3072}
        )
    }
    for i, part in enumerate(np.array_split(np.arange(len(labels)), 5), start=1):
        files[f"data_batch_{i}"] = batch(f"data_batch_{i}", data[part], [labels[j] for j in part])
    files["test_batch"] = batch("test_batch", *test)
    return files


def synthetic(out: str, train: int, test: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    files = cifar_files(synthetic_images(train, rng), synthetic_images(test, rng), CLASSES)
    return write_archive(out, files)


DIGITS_TEST = 360  # images held out as the test set: 20 % of 1,797
DIGITS_SEED = 0  # seed of the split: the same test set on every machine and every run


def digits_images() -> tuple[np.ndarray, list[int]]:
    """scikit-learn's 1,797 digits as CIFAR-10 images (n×3072 uint8 channel planes) and their labels: each 8×8
    scan (values 0..16) scaled to 0..255, enlarged to 32×32 (bilinear), the same grey in all three channels."""
    from PIL import Image  # only this command needs it (torchvision's dependency)
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = np.round(digits.images * (255 / 16)).astype(np.uint8)
    large = np.stack([np.asarray(Image.fromarray(p).resize((32, 32), Image.Resampling.BILINEAR)) for p in small])
    return np.repeat(large[:, None], 3, axis=1).reshape(len(large), 3072), digits.target.tolist()


def digits(out: str) -> str:
    data, labels = digits_images()
    order = np.random.default_rng(DIGITS_SEED).permutation(len(labels))
    test, train = order[:DIGITS_TEST], order[DIGITS_TEST:]
    files = cifar_files(
        (data[train], [labels[i] for i in train]), (data[test], [labels[i] for i in test]), [str(d) for d in range(10)]
    )
    return write_archive(out, files)


def cifar10(out: str) -> str:
    import torchvision  # only this command needs it

    torchvision.datasets.CIFAR10(out, download=True)  # checks the official md5 sums
    return os.path.join(out, ARCHIVE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    syn = sub.add_parser("synthetic", help="learnable generated images in the CIFAR-10 format")
    syn.add_argument("out", help="directory to write cifar-10-python.tar.gz into")
    syn.add_argument("--train", type=int, default=5000, help="training images")
    syn.add_argument("--test", type=int, default=1000, help="test images")
    syn.add_argument("--seed", type=int, default=0, help="seed of the labels and the noise")
    dig = sub.add_parser("digits", help="scikit-learn's real handwritten digits, 32×32, a fixed split (no download)")
    dig.add_argument("out", help="directory to write cifar-10-python.tar.gz into")
    real = sub.add_parser("cifar10", help="download the real CIFAR-10 (needs internet)")
    real.add_argument("out", help="directory to write cifar-10-python.tar.gz into")
    args = parser.parse_args()
    if args.kind == "synthetic":
        if args.train < 5 or args.test < 1:
            parser.error("--train must be at least 5 (one per batch file) and --test at least 1")
        path = synthetic(args.out, args.train, args.test, args.seed)
    elif args.kind == "digits":
        path = digits(args.out)
    else:
        try:
            path = cifar10(args.out)
        except OSError as e:
            print(
                f"ERROR: cannot download CIFAR-10 ({e}); use 'synthetic' or copy {ARCHIVE} into {args.out}",
                file=sys.stderr,
            )
            return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
