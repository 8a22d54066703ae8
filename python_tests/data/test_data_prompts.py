"""Prompt selection for the corpus (flashmap_ext.data.prompts): domains, held-out split, decontamination."""
from flashmap_ext.assets.sharegpt import overlaps
from flashmap_ext.data.prompts import DOMAINS, HELDOUT_MOD, domain, interleave, sharegpt_prompts, split


def conv(i, text):
    return {"id": str(i), "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "a"}]}


def test_domain_rules():
    assert domain("Write a python function that reverses a list") == "code"
    assert domain("Fix this:\n```\nx = 1\n```") == "code"
    assert domain("A shop sells 3 apples for $2. How many apples can I buy with $10?") == "math"
    assert domain("Tell me a story about a lighthouse keeper") == "chat"


def test_split_depends_on_the_text_only_and_holds_out_about_one_in_n():
    texts = [f"Tell me about topic number {i} in some detail please" for i in range(5000)]
    sides = [split(t) for t in texts]
    assert sides == [split("  " + t.upper() + " ") for t in texts]   # case/whitespace do not move a prompt
    share = sides.count("heldout") / len(sides)
    assert abs(share - 1 / HELDOUT_MOD["chat"]) < 0.01


def test_train_and_heldout_are_disjoint_and_cover_everything():
    convs = [conv(i, f"Please explain idea {i} to me, with an example or two") for i in range(400)]
    convs += [conv(1000 + i, f"Please explain idea {i} to me, with an example or two") for i in range(50)]  # dups
    train = list(sharegpt_prompts(convs, "train"))
    held = list(sharegpt_prompts(convs, "heldout"))
    texts_train = {r["messages"][0]["content"] for r in train}
    texts_held = {r["messages"][0]["content"] for r in held}
    assert not texts_train & texts_held
    assert len(texts_train | texts_held) == 400 == len(train) + len(held)
    assert all(r["messages"] == [{"role": "user", "content": r["messages"][0]["content"]}] for r in train)


def test_interleave_round_robin():
    out = [r["i"] for r in interleave({"math": [{"i": 0}], "code": [{"i": 1}, {"i": 3}],
                                       "chat": [{"i": 2}, {"i": 4}, {"i": 5}]})]
    assert out == [0, 1, 2, 3, 4, 5]
    assert DOMAINS == ("math", "code", "chat")


def test_decontamination_rule_flags_a_shared_13_word_run():
    grams = {tuple("natalia sold clips to 48 of her friends in april and then she".split())}
    assert overlaps([{"role": "user", "content": "Q: Natalia sold clips to 48 of her friends in April, and then "
                                                  "she sold half as many"}], grams)
    assert not overlaps([{"role": "user", "content": "Natalia sold clips to friends"}], grams)
