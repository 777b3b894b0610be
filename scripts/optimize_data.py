"""Turn CIFAR-10 (either of the example's layouts) or a folder of images into litdata's optimized format: chunk files
and index.json per split, what litdata's StreamingDataset streams (app/example/streaming_data.py). Each item is
{"id": its index in the split, "image": uint8 H×W×3, "label": its class}. scripts/upload_data.py --format litdata
writes them with this, then uploads them.

A folder of images is read as torchvision's ImageFolder lays it out: one subfolder per class (sorted names: labels
0, 1, ...), with train/ and test/ above them when the folder has both splits, else every image is the training split.

    python scripts/optimize_data.py data/synthetic data/synthetic-litdata --chunk-bytes 1MB
"""

import argparse
import os
import sys

import numpy as np

import make_dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app", "example"))
SPLITS = ("train", "test")  # the folders under the prefix, as the example's StreamingCIFAR10DataModule reads them
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
DEFAULT_CHUNK_BYTES = "64MB"  # litdata's own default: one S3 GET per chunk, few enough requests for any size


def cifar_splits(source: str):
    """{split: (images uint8 N×32×32×3, labels)} of a folder in one of the example's CIFAR-10 layouts, or None."""
    from cifar_files import read_split  # the example's reader: no pickle runs code

    for where in (make_dataset.FOLDER, make_dataset.ARCHIVE):
        if os.path.exists(os.path.join(source, where)):
            path = os.path.join(source, where)
            return {split: read_split(path, split == "train", len(make_dataset.CLASSES)) for split in SPLITS}
    return None


def image_folder(folder: str):
    """(images, labels) of an ImageFolder layout: one subfolder per class."""
    from PIL import Image

    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    paths = [
        (os.path.join(folder, c, n), label)
        for label, c in enumerate(classes)
        for n in sorted(os.listdir(os.path.join(folder, c)))
        if n.lower().endswith(IMAGE_SUFFIXES)
    ]
    if not paths:
        raise SystemExit(f"error: {folder} holds no images in class subfolders (e.g. {folder}/cat/1.png)")
    images = (np.asarray(Image.open(path).convert("RGB")) for path, _ in paths)
    return images, [label for _, label in paths]


def splits(source: str) -> dict:
    if not os.path.isdir(source):
        raise SystemExit(f"error: --from {source} is not a directory; name the folder that holds the data")
    found = cifar_splits(source)
    if found is not None:
        return found
    if all(os.path.isdir(os.path.join(source, split)) for split in SPLITS):
        return {split: image_folder(os.path.join(source, split)) for split in SPLITS}
    return {"train": image_folder(source)}


def optimize(source: str, out: str, chunk_bytes: str = DEFAULT_CHUNK_BYTES) -> dict[str, str]:
    """Write each split of `source` under `out`/<split>/; return {name under the prefix: local path}."""
    try:
        from litdata.streaming.writer import BinaryWriter
    except ImportError:
        raise SystemExit("error: --format litdata needs litdata and torch: run it with .venv/bin/python") from None
    files = {}
    for split, (images, labels) in splits(source).items():
        folder = os.path.join(out, split)
        writer = BinaryWriter(folder, chunk_bytes=chunk_bytes)
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            writer[i] = {"id": i, "image": np.ascontiguousarray(image, dtype=np.uint8), "label": int(label)}
        writer.done()
        writer.merge()
        files.update({f"{split}/{name}": os.path.join(folder, name) for name in sorted(os.listdir(folder))})
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", help="CIFAR-10 (its archive or folder) or a folder of images")
    parser.add_argument("out", help="where the splits go (train/, test/)")
    parser.add_argument("--chunk-bytes", default=DEFAULT_CHUNK_BYTES, help="the size of each chunk, e.g. 64MB")
    args = parser.parse_args()
    for name in optimize(args.source, args.out, args.chunk_bytes):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
