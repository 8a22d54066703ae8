"""`flashmap eval --heldout`: a file of plain conversations (no corpus ids) is refused in one line."""
import json

import pytest

from flashmap_ext.evaluate.run import load_heldout
from flashmap_ext.target import load_target


def test_records_without_ids_are_refused_naming_heldout(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    _, tokenizer = load_target("tiny-random")
    with pytest.raises(ValueError, match=r"--heldout .*record 0 has no 'id'"):
        load_heldout(str(path), tokenizer, per_domain=None, max_length=None)
