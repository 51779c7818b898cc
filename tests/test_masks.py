import json

import pytest
import torch

from compressor.core.masks import HeadMask, MaskError, load_masks, save_masks


def test_json_round_trip(tmp_path):
    masks = [HeadMask.from_kept([[0, 2], [1]], [4, 3]), HeadMask.from_kept([[3], [0, 1, 2]], [4, 3])]
    save_masks(tmp_path / "m.json", masks)
    back = load_masks(tmp_path / "m.json")
    assert back == masks
    assert back[0].kept_indices(0) == [0, 2] and back[1].num_kept() == [1, 3]
    assert json.loads((tmp_path / "m.json").read_text())["members"][0]["heads"] == [4, 3]
    assert not list(tmp_path.glob(".*tmp"))  # no temporary left behind


def test_validation_errors():
    m = HeadMask.from_kept([[0], []], [4, 4])
    with pytest.raises(MaskError, match="block 1 keeps no head"):
        m.validate([4, 4])
    m.validate([4, 4], allow_empty_blocks=True)
    with pytest.raises(MaskError, match="has 2 blocks, the model has 3"):
        m.validate([4, 4, 4])
    with pytest.raises(MaskError, match="block 0 has 4 heads, the model has 6"):
        m.validate([6, 4], allow_empty_blocks=True)


def test_load_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(MaskError, match="bad.json: not valid JSON"):
        load_masks(p)
    p.write_text(json.dumps({"members": [{"heads": [4], "kept": [[7]]}]}))
    with pytest.raises(MaskError, match=r"members\[0\]: block 0 keeps head indices \[7\]"):
        load_masks(p)
    with pytest.raises(MaskError, match="no such mask file"):
        load_masks(tmp_path / "missing.json")


def test_equality_and_hash():
    a = HeadMask((torch.tensor([True, False]),))
    b = HeadMask.from_kept([[0]], [2])
    assert a == b and hash(a) == hash(b) and a in [b]
    assert a != HeadMask.from_kept([[1]], [2])
