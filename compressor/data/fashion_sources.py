"""How `datasets/fashion_mnist.npz` was built: a seeded, class-balanced subset of Fashion-MNIST
(Zalando SE, MIT licence) from the Debian package `dataset-fashion-mnist`
(`/usr/share/datasets/fashion-mnist/*-idx*-ubyte.gz`, or those files from the unpacked .deb):
300 images per class from its training set and 100 per class from its test set, all 10 classes
(a recipe chooses which are in-distribution). Rerun:

    apt-get download dataset-fashion-mnist && dpkg-deb -x dataset-fashion-mnist_*.deb deb/
    python -m compressor.data.fashion_sources deb/usr/share/datasets/fashion-mnist
"""

from __future__ import annotations

import argparse
import gzip
import io
from pathlib import Path

import numpy as np

from compressor.data.committed import record_in_manifest

OUT = Path(__file__).resolve().parents[1] / "datasets" / "fashion_mnist.npz"
PER_CLASS = {"train": 300, "test": 100}
SEED = 0


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped): unsigned bytes with their dimensions in the header."""
    raw = gzip.decompress(path.read_bytes())
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def subset(images: np.ndarray, labels: np.ndarray, per_class: int, rng: np.random.Generator):
    keep = np.concatenate([rng.choice(np.flatnonzero(labels == c), per_class, replace=False) for c in range(10)])
    keep = rng.permutation(keep)
    return images[keep], labels[keep].astype(np.uint8)


def build(source: Path) -> bytes:
    rng = np.random.default_rng(SEED)
    arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(source / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(source / f"{prefix}-labels-idx1-ubyte.gz")
        arrays[f"{split}_x"], arrays[f"{split}_y"] = subset(images, labels, PER_CLASS[split], rng)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="folder with the four *-idx*-ubyte.gz files")
    args = p.parse_args()
    blob = build(args.source)
    OUT.write_bytes(blob)
    print(f"{OUT}: {len(blob) / 2**20:.2f} MiB, sha256 {record_in_manifest(OUT)}")


if __name__ == "__main__":
    main()
