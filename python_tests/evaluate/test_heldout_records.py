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


@pytest.mark.parametrize("domain", [None, "writing"])
def test_records_without_a_known_domain_are_refused_naming_the_record(tmp_path, domain):
    """A record without a domain was counted as chat without a word; one of another domain fell out of the
    per-domain tables but not out of "all"."""
    path = tmp_path / "d.jsonl"
    rows = [{"id": "a", "domain": "math", "messages": [{"role": "user", "content": "1+1"}]},
            {"id": "b", "messages": [{"role": "user", "content": "hi"}]}]
    if domain:
        rows[1]["domain"] = domain
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, tokenizer = load_target("tiny-random")
    with pytest.raises(ValueError, match=rf"--heldout .*record 'b' has domain {domain!r}: .*math, code, chat"):
        load_heldout(str(path), tokenizer, per_domain=None, max_length=None)
