"""opforge blind-read: packet without comments or docstrings, hidden key, scoring."""

import json

import pytest
from opforge.pipeline.blind_read import BlindReadError, make_packet, score, strip_source

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """SECRET-DOCSTRING {k}"""

    def forward(self, x):
        # SECRET-COMMENT
        return torch.relu(x) * {k}


def get_inputs():
    return [torch.randn(2, {k})]


def get_init_inputs():
    return []
'''


def _dataset(path, k0, n):
    with open(path, "w") as fh:
        for k in range(k0, k0 + n):
            fh.write(json.dumps({"code": TASK.format(k=k)}) + "\n")
    return str(path)


def test_strip_source_drops_comments_and_docstrings():
    out = strip_source(TASK.format(k=3))
    assert "SECRET" not in out and "torch.relu(x) * 3" in out
    compile(out, "x", "exec")


def test_packet_hides_the_source_and_scores_per_dataset(tmp_path):
    a = _dataset(tmp_path / "a.jsonl", 10, 5)
    b = _dataset(tmp_path / "b.jsonl", 50, 5)
    folder = make_packet({"ours": a, "theirs": b}, 3, tmp_path / "packet", seed=1)
    packet = (folder / "packet.md").read_text()
    assert "SECRET" not in packet and "ours" not in packet and "theirs" not in packet
    key = json.loads((folder / "key.json").read_text())["key"]
    assert len(key) == 6 and sorted(v["dataset"] for v in key.values()) == ["ours"] * 3 + ["theirs"] * 3
    judged = json.loads((folder / "judgments.template.json").read_text())
    for rid, where in key.items():
        judged[rid] = {"sensible": where["dataset"] == "ours", "strong": True, "note": ""}
    (tmp_path / "j.json").write_text(json.dumps(judged))
    res = score(folder, tmp_path / "j.json")
    assert res["ours"]["sensible_share"] == 1.0 and res["theirs"]["sensible_share"] == 0.0
    assert res["theirs"]["strong"] == 3 and res["ours"]["both"] == 3
    judged[next(iter(key))] = {"sensible": None, "strong": True}
    (tmp_path / "j.json").write_text(json.dumps(judged))
    with pytest.raises(BlindReadError, match="needs boolean"):
        score(folder, tmp_path / "j.json")


def test_too_few_rows_is_an_error(tmp_path):
    a = _dataset(tmp_path / "a.jsonl", 0, 2)
    with pytest.raises(BlindReadError, match="only 2 parseable rows"):
        make_packet({"a": a}, 3, tmp_path / "p")
