# standalone_hf.py: a plain text export with transformers and torch alone
import json

from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

folder = "runs/my_text/export"  # a plain export of a text classifier
cfg = json.load(open(f"{folder}/config.json"))
tok = AutoTokenizer.from_pretrained(f"{folder}/hf_encoder")
encoder = AutoModel.from_pretrained(f"{folder}/hf_encoder").eval()
head = load_file(f"{folder}/hf_encoder/mean_pool_head.safetensors")  # the classifier on the mean
temperature = ((cfg.get("calibration") or {}).get("temperature") or [1.0])[0]


def calibrated_probs(sentences):  # what compressor.load(folder)(input_ids).probs gives
    max_length = cfg["preprocessing"]["max_length"]
    batch = tok(sentences, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
    states, mask = encoder(**batch).last_hidden_state, batch["attention_mask"].unsqueeze(-1).float()
    logits = (states * mask).sum(1) / mask.sum(1) @ head["weight"].T + head["bias"]
    return (logits / temperature).softmax(-1)
