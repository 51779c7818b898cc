# standalone_timm.py: a plain timm export with timm and torch alone
import json
from functools import partial

import timm
from safetensors.torch import load_file

folder = "runs/vit_prune/export"
cfg = json.load(open(f"{folder}/config.json"))
model = timm.create_model(**cfg["timm"])  # the unpruned architecture, by timm's own arguments
norm, act = partial(timm.layers.LayerNorm, eps=cfg["timm_norm_eps"]), timm.layers.get_act_layer(cfg["timm_act_layer"])
for blk, b in zip(model.blocks, cfg["timm_blocks"]):  # timm's own Attention/Mlp at the pruned sizes
    blk.attn = timm.layers.Attention(
        model.embed_dim, b["num_heads"], b["head_dim"], **cfg["timm_attention"], norm_layer=norm
    )
    blk.mlp = timm.layers.Mlp(model.embed_dim, b["mlp_hidden"], act_layer=act, **cfg["timm_mlp"])
model.load_state_dict(load_file(f"{folder}/model.safetensors"))
model.eval()
model.pretrained_cfg = {k: v for k, v in cfg["preprocessing"].items() if k != "kind"}  # resolve_data_config reads it
temperature = ((cfg.get("calibration") or {}).get("temperature") or [1.0])[0]  # the calibrate step's


def calibrated_probs(x):  # what compressor.load(folder)(x).probs gives
    return (model(x) / temperature).softmax(-1)
