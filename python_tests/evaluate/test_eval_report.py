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
