"""Write the small example datasets the "own dataset" recipes read, from data that ships offline:

    python recipes/own_data/make.py

- topics_train.csv, topics_test.csv (text, label: a topic name) and topics_ood.jsonl (held-out
  topics): a sample of the committed Wikipedia-topics benchmark, as a user's own CSV would be;
- digits_disk/: scikit-learn's digits as a `datasets` DatasetDict of PNG images with a ClassLabel
  (train and test splits of digits 0-7, written by save_to_disk), and digits_ood_disk/ (digits 8-9).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _quiet() -> None:
    import datasets

    datasets.disable_progress_bars()


def write_topics(per_split: dict[str, int], seed: int = 0) -> None:
    import numpy as np

    from compressor.data.text import task_rows

    rows = task_rows("topics")
    rng = np.random.default_rng(seed)
    for split, n in per_split.items():
        chosen = [r for r in rows if r["split"] == split]
        chosen = [chosen[i] for i in sorted(rng.permutation(len(chosen))[:n])]
        with open(HERE / f"topics_{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([r["text"], r["label"]] for r in chosen)
    ood = [r for r in rows if r["split"] == "ood/held_out_topics"][:300]
    with open(HERE / "topics_ood.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": r["text"]}) + "\n" for r in ood)


def write_digits() -> None:
    import datasets
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray((img * 255 / 16).astype(np.uint8)) for img in digits.images]
    labels = digits.target.tolist()
    order = np.random.default_rng(0).permutation(len(labels))
    inside = [i for i in order if labels[i] < 8]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(i) for i in range(8)])}
    )

    def table(idx: list[int]) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"image": [images[i] for i in idx], "label": [labels[i] for i in idx]}, features
        )

    cut = int(0.75 * len(inside))
    datasets.DatasetDict({"train": table(inside[:cut]), "test": table(inside[cut:])}).save_to_disk(HERE / "digits_disk")
    outside = [i for i in order if labels[i] >= 8]
    datasets.Dataset.from_dict({"image": [images[i] for i in outside]}).save_to_disk(HERE / "digits_ood_disk")


if __name__ == "__main__":
    _quiet()
    write_topics({"train": 1200, "test": 400})
    write_digits()
    print(f"wrote the example datasets under {HERE}")
