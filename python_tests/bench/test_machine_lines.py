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


def test_busy_note_when_the_load_exceeds_the_usable_cores():
    """The demo printed the load average and nothing else: its speedups looked as solid on a busy machine."""
    from flashmap_ext.bench.machine import busy_note
    expected = ("Note: the timings were taken on a busy machine (load 3.24 on 2 cores): the speedups are noisy; "
                "γ and identity to greedy are unaffected.")
    assert busy_note(3.24, 1.0, 2) == expected          # busy at the start
    assert busy_note(0.5, 3.24, 2) == expected          # busy at the end
    assert "load 1.50 on 1 core)" in busy_note(1.5, 0.2, 1)


def test_no_busy_note_up_to_one_task_per_core():
    from flashmap_ext.bench.machine import busy_note
    assert busy_note(2.0, 1.99, 2) is None and busy_note(0.0, 0.0, 1) is None


def test_usable_cores_is_the_affinity_mask_not_the_machine():
    import os

    from flashmap_ext.bench.machine import usable_cores
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mask)})   # pinned to one core (taskset -c 0) on any machine
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, mask)
