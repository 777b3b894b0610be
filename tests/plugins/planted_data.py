"""litdata datasets for the tests of streamed data that must never run code (app/sagemaker_lightning/data/decoders.py):
the example's fields (an id, an image as a uint8 array, a label), made with litdata.optimize as a project makes one,
and with a marker one more field: an object whose unpickling writes that marker file, code that whoever wrote the data
chose (the case of issue 48).

    python -c "import planted_data; print(planted_data.optimized('/tmp/planted', '/tmp/marker'))"
"""

import functools
import pathlib

import numpy as np


class Planted:
    """A field's value whose unpickling writes `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (pathlib.Path(self.marker), "ran")


def item(i: int, marker: str | None) -> dict:
    image = np.full((4, 4, 3), i, np.uint8)
    return {"id": i, "image": image, "label": i % 2} | ({"extra": Planted(marker)} if marker else {})


def optimized(folder: str, marker: str | None) -> str:
    """8 items in `folder` (index.json and one chunk), made by litdata.optimize with one forked worker (0.2 s)."""
    from litdata import optimize

    optimize(functools.partial(item, marker=marker), list(range(8)), str(folder), chunk_bytes="1MB", num_workers=1,
             start_method="fork", verbose=False)  # fmt: skip
    return str(folder)
