"""evaluate/report.py: the eval.md table keeps each figure under its own column."""
from flashmap_ext.evaluate.report import markdown


def _row(accs, gamma):
    return {"anchors": 10, "slot_accuracy": accs, "gamma": gamma}


def test_a_drafter_with_fewer_slots_fills_its_row_with_dashes():
    report = {"meta": {"heldout": "h", "command": "c", "target": "t", "dtype": "fp32", "cpu": "x", "bf16_hw": False,
                       "torch_threads": 1, "date": "d"},
              "heldout": {"math": {"sequences": 1, "answer_tokens": 5}}, "target_greedy_agreement": 1.0,
              "results": {"long": {"all": _row([0.5, 0.4, 0.3, 0.2, 0.1], 2.5)},
                          "short": {"all": _row([0.25], 1.25)}}}
    lines = markdown(report).splitlines()
    assert lines[0] == "| drafter | domain | anchors | slot 1 | slot 2 | slot 3 | slot 4 | γ implied |"
    assert "| long | all | 10 | 0.500 | 0.400 | 0.300 | 0.200 | 2.500 |" in lines
    assert "| short | all | 10 | 0.250 | – | – | – | 1.250 |" in lines
    assert "Slots 5–5: eval.json (slot_accuracy) and eval.png; γ implied counts all 5." in lines


def test_fewer_slots_are_named_on_stderr(capsys):
    """--slots above a drafter's draft tokens was cut to them without a word."""
    from types import SimpleNamespace

    from flashmap_ext.evaluate.run import note_fewer_slots, scored_slots
    drafters = {"a": SimpleNamespace(num_draft_tokens=4), "b": SimpleNamespace(num_draft_tokens=16)}
    scored = {name: scored_slots(8, d) for name, d in drafters.items()}
    assert scored == {"a": 4, "b": 8}
    note_fewer_slots(8, scored)
    assert capsys.readouterr().err.strip() == ("--slots 8: scored on every draft token of the drafters that draft "
                                               "fewer (a 4)")
    note_fewer_slots(4, {"a": 4, "b": 4})
    assert capsys.readouterr().err == ""
