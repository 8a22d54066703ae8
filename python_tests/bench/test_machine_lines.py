"""The machine lines under every measured table: counts in words a reader takes at face value."""
from flashmap_ext.bench.machine import summary_line

META = {"gpu": None, "cpu": "Some CPU", "load_average": 0.5, "torch": "2.0", "date": "2026-12-04T10:00:00"}


def test_summary_line_says_1_torch_thread_and_1_core():
    """The demo's caption said '1 torch threads' (and would say '1 cores')."""
    line = summary_line({**META, "cores": 1, "torch_threads": 1})
    assert line == "Some CPU, 1 core, 1 torch thread, load 0.5; torch 2.0; 2026-12-04"


def test_summary_line_plural_from_2():
    line = summary_line({**META, "cores": 2, "torch_threads": 2})
    assert line == "Some CPU, 2 cores, 2 torch threads, load 0.5; torch 2.0; 2026-12-04"
