"""scripts/checkpoints.py: checkpoint weights leave the working tree but come back from git history
(checkpoints/MANIFEST.json), checked by sha256; a shallow clone gets a one-line `git fetch --unshallow` hint.
Runs on a throw-away git repository; the expected bytes are the ones committed there."""
import hashlib
import importlib.util
import json
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("checkpoints_script", ROOT / "scripts" / "checkpoints.py")
checkpoints = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checkpoints)


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository whose weights were committed, recorded in the manifest, then removed from the tree."""
    root = tmp_path / "repo"
    weights = root / "checkpoints" / "tiny" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    git(tmp_path, "init", "-q", str(root))
    payload = bytes(range(256)) * 64
    weights.write_bytes(payload)
    git(root, "add", ".")
    git(root, "commit", "-qm", "weights")
    checkpoints.main(["record", str(weights)], root=root)
    git(root, "rm", "-q", "--cached", "checkpoints/tiny/model.safetensors")
    git(root, "add", "checkpoints/MANIFEST.json")
    git(root, "commit", "-qm", "weights leave the tree")
    weights.unlink()
    return root, weights, payload


def test_record_writes_blob_size_and_sha256(repo):
    root, _, payload = repo
    (entry,) = json.loads((root / "checkpoints" / "MANIFEST.json").read_text())["files"]
    assert entry["path"] == "checkpoints/tiny/model.safetensors" and entry["size"] == len(payload)
    assert entry["sha256"] == hashlib.sha256(payload).hexdigest()
    assert entry["blob"] == git(root, "rev-parse", "HEAD~1:checkpoints/tiny/model.safetensors")


def test_materialise_restores_the_bytes_and_is_quiet_the_second_time(repo, capsys):
    root, weights, payload = repo
    checkpoints.main([], root=root)
    assert weights.read_bytes() == payload
    assert "wrote checkpoints/tiny/model.safetensors" in capsys.readouterr().out
    checkpoints.main([], root=root)
    assert capsys.readouterr().out == ""
    weights.write_bytes(b"truncated")  # a damaged copy is replaced
    checkpoints.main([], root=root)
    assert weights.read_bytes() == payload


def test_a_wrong_sha256_in_the_manifest_is_refused(repo):
    root, weights, _ = repo
    manifest = root / "checkpoints" / "MANIFEST.json"
    data = json.loads(manifest.read_text())
    data["files"][0]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="has sha256 .* the manifest says 0000"):
        checkpoints.main([], root=root)
    assert not weights.exists()


def test_a_shallow_clone_is_told_to_unshallow(repo, tmp_path):
    root, _, _ = repo
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{root}", str(clone))
    with pytest.raises(SystemExit, match=r"shallow clone: run `git fetch --unshallow`"):
        checkpoints.main([], root=clone)
    git(clone, "fetch", "-q", "--unshallow")
    checkpoints.main([], root=clone)
    assert (clone / "checkpoints" / "tiny" / "model.safetensors").is_file()


def test_the_committed_manifest_names_blobs_of_this_repository():
    """Every manifest entry is a blob reachable here (not checked in a shallow clone)."""
    if checkpoints.git(ROOT, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("shallow clone")
    for entry in json.loads((ROOT / "checkpoints" / "MANIFEST.json").read_text())["files"]:
        assert checkpoints.git(ROOT, "cat-file", "-s", entry["blob"]) == str(entry["size"]), entry["path"]
        assert not checkpoints.git(ROOT, "ls-files", entry["path"]), f"{entry['path']} is still tracked"


def test_demo_names_make_checkpoints_when_the_weights_are_not_written(tmp_path, monkeypatch):
    from flashmap_ext.commands.demo import DEMO_DRAFTER, find_drafter
    (tmp_path / DEMO_DRAFTER).mkdir(parents=True)
    (tmp_path / DEMO_DRAFTER / "config.json").write_text("{}")  # tracked; model.safetensors is not
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="make checkpoints"):
        find_drafter(None)
    (tmp_path / DEMO_DRAFTER / "model.safetensors").write_bytes(b"")
    assert find_drafter(None) == tmp_path / DEMO_DRAFTER


def test_demo_loads_the_flashmap_checkpoint_with_the_best_committed_heldout_gamma():
    """DEMO_DRAFTER is the FlashMap checkpoint (map or flow, at the steps the demo drafts: 1) whose implied γ
    over all held-out domains is highest in the committed eval of every default drafter."""
    from flashmap_ext.commands.demo import DEMO_DRAFTER
    from flashmap_ext.evaluate.run import DEFAULT_DRAFTERS, parse_drafter
    report = json.loads((ROOT / "docs" / "bench" / "heldout-eval" / "eval.json").read_text())
    by_spec = {d["spec"]: name for name, d in report["drafters"].items()}  # the report's own names
    gamma = {}
    for spec in DEFAULT_DRAFTERS:
        _, path, steps, _ = parse_drafter(spec)
        if "flashmap-" in str(path) and steps == 1:
            hist = report["results"][by_spec[spec.split("=", 1)[1]]]["all"]["run_histogram"]
            gamma[path] = 1 + sum(r * p for r, p in enumerate(hist))
    assert len(gamma) == 2, gamma  # the distilled map and the flow model
    assert DEMO_DRAFTER == max(gamma, key=gamma.get), gamma


def test_publish_casts_to_bf16_commits_records_and_untracks(repo, tmp_path, monkeypatch):
    import torch
    for who in ("AUTHOR", "COMMITTER"):  # publish commits: a CI machine may have no git identity
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@t")
    from safetensors.torch import load_file, save_file
    root, _, _ = repo
    src = tmp_path / "drafter"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "tiny", "torch_dtype": "float32"}')
    weight = torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(3, 4)
    save_file({"w": weight, "d2t": torch.arange(5)}, str(src / "model.safetensors"))
    before = int(git(root, "rev-list", "--count", "HEAD"))
    checkpoints.main(["publish", "fresh", str(src), "a new drafter"], root=root)
    assert int(git(root, "rev-list", "--count", "HEAD")) == before + 2
    out = load_file(str(root / "checkpoints" / "fresh" / "model.safetensors"))
    assert out["w"].dtype == torch.bfloat16 and torch.equal(out["w"], weight.to(torch.bfloat16))
    assert out["d2t"].dtype == torch.int64 and out["d2t"].tolist() == [0, 1, 2, 3, 4]
    config = json.loads((root / "checkpoints" / "fresh" / "config.json").read_text())
    assert config == {"model_type": "tiny", "torch_dtype": "bfloat16"}, "the config names the weights' dtype"
    tracked = git(root, "ls-files", "checkpoints/fresh").split()
    assert tracked == ["checkpoints/fresh/config.json"], "the weights leave the tree"
    entries = {e["path"]: e for e in json.loads((root / "checkpoints" / "MANIFEST.json").read_text())["files"]}
    entry = entries["checkpoints/fresh/model.safetensors"]
    assert entry["blob"] == git(root, "rev-parse", "HEAD~1:checkpoints/fresh/model.safetensors")
    assert entry["sha256"] == hashlib.sha256((root / "checkpoints/fresh/model.safetensors").read_bytes()).hexdigest()


def test_publish_refuses_a_dir_without_weights(repo, tmp_path):
    root, _, _ = repo
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="has no config.json"):
        checkpoints.main(["publish", "x", str(tmp_path / "empty"), "m"], root=root)
