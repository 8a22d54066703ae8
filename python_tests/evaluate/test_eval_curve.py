"""`flashmap eval curve` (evaluate/curve.py): table, stopping rule and plot of a long run's held-out evals
(fixture JSONs)."""
import json
import pathlib

import pytest

from flashmap_ext import cli
from flashmap_ext.evaluate import curve


def write_eval(path: pathlib.Path, name: str, slot1_all: float, gamma: float):
    res = {d: {"anchors": 100, "slot_accuracy": [slot1_all + off, 0.1], "gamma": gamma}
           for d, off in (("math", 0.05), ("code", -0.05), ("chat", 0.0), ("all", 0.0))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": {"date": "2026-12-02T01:00:00+00:00"}, "results": {name: res}}))


def fixture(tmp_path):
    # DFlash: 1k -> 3k steps +0.06 (step-bound); FlashMap: 3k -> 9k steps +0.01 (data-bound)
    for steps, s1, g in ((1000, 0.20, 1.25), (3000, 0.26, 1.35), (9000, 0.30, 1.42)):
        write_eval(tmp_path / f"d{steps}" / "eval.json", "DFlash", s1, g)
    for steps, s1, g in ((3000, 0.22, 1.27), (9000, 0.23, 1.28)):
        write_eval(tmp_path / f"f{steps}" / "eval.json", "FlashMap-1", s1, g)
    series = {"title": "fixture", "series": [
        {"name": "DFlash", "points": [{"steps": s, "cpu_hours": s / 3000, "eval": f"d{s}/eval.json"}
                                      for s in (9000, 1000, 3000)]},  # any order
        {"name": "FlashMap-1", "points": [{"steps": s, "cpu_hours": s / 4000, "eval": f"f{s}/eval.json"}
                                          for s in (3000, 9000)]}]}
    path = tmp_path / "series.json"
    path.write_text(json.dumps(series))
    return path


def test_table_and_stopping_rule(tmp_path):
    c = curve.load_series(fixture(tmp_path))
    assert [p["steps"] for p in c["series"][0]["points"]] == [1000, 3000, 9000]
    checks = curve.stopping_rule(c["series"][0]["points"])
    assert [(x["from"], x["to"]) for x in checks] == [(1000, 3000), (3000, 9000)]
    assert checks[0]["gain"] == pytest.approx(0.06) and not checks[0]["data_bound"]
    assert curve.stopping_rule(c["series"][1]["points"])[0]["data_bound"]  # +0.01 < 0.02
    md = curve.markdown(c)
    assert "| DFlash | 1,000 | 0.33 | – | 0.250 / 0.150 / 0.200 | 0.200 | 1.250 | 100 |" in md
    assert "FlashMap-1: 3,000 → 9,000 steps moved slot 1 by +0.010 (data-bound" in md
    assert "DFlash: 3,000 → 9,000 steps moved slot 1 by +0.040 (still step-bound" in md


def test_cli_writes_plot_and_table(tmp_path):
    assert cli.main(["eval", "curve", str(fixture(tmp_path)), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "curve.png").stat().st_size > 1000
    assert (tmp_path / "out" / "curve.md").read_text().startswith("| drafter |")


def test_epochs_column_and_panel_where_points_give_them(tmp_path):
    path = fixture(tmp_path)
    spec = json.loads(path.read_text())
    spec["series"][0]["points"][0]["epochs"] = 4.25
    path.write_text(json.dumps(spec))
    c = curve.load_series(path)
    md = curve.markdown(c)
    assert "| DFlash | 9,000 | 3.00 | 4.2 |" in md and "| DFlash | 1,000 | 0.33 | – |" in md
    assert cli.main(["eval", "curve", str(path), "--out", str(tmp_path / "out")]) == 0
    from PIL import Image
    wide, plain = Image.open(tmp_path / "out" / "curve.png").size, None
    assert cli.main(["eval", "curve", str(fixture(tmp_path)), "--out", str(tmp_path / "plain")]) == 0
    plain = Image.open(tmp_path / "plain" / "curve.png").size
    assert wide[0] > 1.4 * plain[0]  # a third column of panels


def test_a_long_title_stays_inside_the_figure(tmp_path, monkeypatch):
    """A one-line title of a few hundred characters ran past both edges of the plot; it now wraps."""
    import matplotlib.figure
    boxes = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        save(fig, *args, **kwargs)
        boxes.append((fig._suptitle.get_window_extent(fig.canvas.get_renderer()), fig.bbox.width))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    c = curve.load_series(fixture(tmp_path))
    c["title"] = "a long title about the run, its machine and its corpus; " * 7
    curve.plot(c, tmp_path / "curve.png")
    box, width = boxes[0]
    assert 0 <= box.x0 and box.x1 <= width, (box, width)


def test_missing_drafter_is_named(tmp_path):
    path = fixture(tmp_path)
    spec = json.loads(path.read_text())
    spec["series"][0]["points"][0]["drafter"] = "EAGLE-3"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="series 'DFlash'.*no drafter 'EAGLE-3'"):
        curve.load_series(path)


def test_newest_stretch_reads_the_rate_now(tmp_path):
    """The tripling rule measured from an early point can say step-bound while the curve has flattened since;
    the newest stretch (last point back to the newest one with at most half its steps) reads the rate now."""
    c = curve.load_series(fixture(tmp_path))
    r = curve.recent_rate(c["series"][0]["points"])   # 3,000 -> 9,000: +0.04 over exactly x3
    assert (r["from"], r["to"]) == (3000, 9000) and r["per_tripling"] == pytest.approx(0.04) and not r["data_bound"]
    pts = [{"steps": s, "slot1": {"all": a}} for s, a in ((7000, 0.365), (19000, 0.446), (20000, 0.45),
                                                          (40000, 0.459))]
    r = curve.recent_rate(pts)   # 20,000 -> 40,000: +0.009 over x2, carried to x3: 0.009 * ln 3 / ln 2
    assert r["from"] == 20000 and r["per_tripling"] == pytest.approx(0.009 * 1.5849625, rel=1e-6)
    assert r["data_bound"] is True
    assert curve.recent_rate(pts[:1]) is None
    assert "Newest stretch: 3,000 → 9,000 steps moved slot 1 by +0.040, +0.040 per tripling" in curve.markdown(c)


def edit_point(path, key, value, series=0, point=0):
    """Sets (value not None) or removes a key of one point of the fixture's series.json."""
    spec = json.loads(path.read_text())
    p = spec["series"][series]["points"][point]
    p.pop(key, None) if value is None else p.__setitem__(key, value)
    path.write_text(json.dumps(spec))


@pytest.mark.parametrize("key,value,message", [
    ("steps", -3000, r"points\[0\]: steps must be a positive integer, got -3000"),
    ("steps", 0, r"points\[0\]: steps must be a positive integer, got 0"),
    ("steps", 9000.5, r"points\[0\]: steps must be a positive integer, got 9000.5"),
    ("steps", True, r"points\[0\]: steps must be a positive integer, got True"),
    ("steps", "9000", r"points\[0\]: steps must be a positive integer, got '9000'"),
    ("cpu_hours", -1, r"points\[0\]: cpu_hours must be a finite number >= 0, got -1"),
    ("cpu_hours", float("inf"), r"points\[0\]: cpu_hours must be a finite number >= 0, got inf"),
    ("cpu_hours", float("nan"), r"points\[0\]: cpu_hours must be a finite number >= 0, got nan"),
    ("cpu_hours", None, r"points\[0\]: no 'cpu_hours'"),
    ("epochs", -0.5, r"points\[0\]: epochs must be a finite number >= 0, got -0.5"),
    ("epochs", "4", r"points\[0\]: epochs must be a finite number >= 0, got '4'"),
    ("epoch", 4.0, r"points\[0\]: unknown key\(s\) \['epoch'\]"),
    ("eval", 3, r"points\[0\]: eval must be a string, got 3")])
def test_malformed_points_are_named(tmp_path, key, value, message):
    """A negative step count ended in 'math domain error', 0 in a ZeroDivisionError; a misspelt "epoch" was
    ignored; a negative or infinite CPU-hour count went into the table."""
    path = fixture(tmp_path)
    edit_point(path, key, value)
    with pytest.raises(ValueError, match=f"^{path}: series 'DFlash', {message}"):
        curve.load_series(path)


def test_a_step_count_twice_in_a_series_is_refused(tmp_path):
    path = fixture(tmp_path)
    edit_point(path, "steps", 3000)  # DFlash's 9000 → a second 3000
    with pytest.raises(ValueError, match=r"series 'DFlash': steps \[3000\] given by more than one point"):
        curve.load_series(path)
    edit_point(path, "steps", 9000)
    c = curve.load_series(path)  # 3000 in both series: one count per series, not across them
    assert all(3000 in [p["steps"] for p in s["points"]] for s in c["series"])


def test_missing_or_broken_eval_files_name_the_series_file_and_point(tmp_path):
    path = fixture(tmp_path)
    edit_point(path, "eval", "nowhere/eval.json", series=1, point=1)
    with pytest.raises(FileNotFoundError, match=rf"^{path}: series 'FlashMap-1', points\[1\] \(steps 9000\): "
                                                r"no such file .*nowhere/eval.json"):
        curve.load_series(path)
    (tmp_path / "f9000" / "eval.json").write_text('{"results": ')
    edit_point(path, "eval", "f9000/eval.json", series=1, point=1)
    with pytest.raises(ValueError, match=r"points\[1\] \(steps 9000\): .*f9000/eval.json is not JSON"):
        curve.load_series(path)
    (tmp_path / "f9000" / "eval.json").write_text(json.dumps({"results": {"FlashMap-1": {"math": {}}}}))
    with pytest.raises(ValueError, match=r"points\[1\] \(steps 9000\): f9000/eval.json is not an eval.json"):
        curve.load_series(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=rf"^{path}: .*series.json is not JSON"):
        curve.load_series(path)


@pytest.mark.parametrize("spec", [[], {}, {"series": []}, {"series": [{"name": "A", "points": []}]},
                                  {"series": [{"points": [{"steps": 1}]}]}, {"series": [{"name": "A", "points": [5]}]}])
def test_malformed_series_files_are_named(tmp_path, spec):
    path = tmp_path / "series.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=f"^{path}: "):
        curve.load_series(path)


def test_cli_prints_one_line_for_a_malformed_point(tmp_path, capsys):
    path = fixture(tmp_path)
    edit_point(path, "steps", 0)
    assert cli.main(["eval", "curve", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flashmap eval curve: error:" in err and "steps must be a positive integer" in err


def test_every_series_has_its_own_line_style(tmp_path, monkeypatch):
    """With more series than the 10 default colours, the 11th drew exactly like the 1st."""
    import matplotlib.figure
    styles = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        save(fig, *args, **kwargs)
        styles.extend((line.get_color(), line.get_linestyle(), line.get_marker()) for line in fig.axes[0].lines)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    c = curve.load_series(fixture(tmp_path))
    c["series"] = [dict(c["series"][0], name=f"arm {i}") for i in range(12)]
    curve.plot(c, tmp_path / "curve.png")
    assert len(styles) == 12 and len(set(styles)) == 12, styles
