"""The synthetic target: a small Qwen3ForCausalLM trained on the synthetic language, saved as an ordinary model
directory (config.json, safetensors, a word-level tokenizer with a chat template), so `--target DIR` loads it
in every command (DESIGN.md §13).

Conversations: the user turn is the header, the assistant turn the body; the template renders
"<s> h… b… </s>", i.e. exactly the language's BOS, header, body, EOS, with the loss on body + EOS.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from flashmap_ext.synthetic.language import BOS, EOS, Language, LanguageSpec, Parser, sample_corpus, sample_sequence

TEMPLATE = ("<s>{% for m in messages %} {{ m['content'] }}{% endfor %}"
            "{% if messages[-1]['role'] == 'assistant' %} </s>{% endif %}")
TRAIN_SEED, HELDOUT_SEED = 1, 2  # corpus seeds: the target's training text and every held-out set


@dataclass(frozen=True)
class TargetRecipe:
    """Shape and training budget of the synthetic target (defaults: ≈ 0.23 M parameters, a few CPU minutes)."""
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    steps: int = 1500
    batch: int = 16
    lr: float = 3e-3
    seed: int = 0


def token_names(lang: Language) -> list[str]:
    """The word of every id: <s>, </s>, h0…, P0…, C2…, f0…, w0…"""
    names = ["<s>", "</s>"]
    for prefix, ids, first in (("h", lang.header_ids, 0), ("P", lang.phrase_markers, 0), ("C", lang.copy_markers, 2),
                               ("f", lang.filler_ids, 0), ("w", lang.phrase_ids, 0)):
        names += [f"{prefix}{i + first}" for i in range(len(ids))]
    return names


def make_tokenizer(lang: Language) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `token_names` (whitespace-separated), BOS <s>, EOS </s>, `TEMPLATE`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(token_names(lang))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", chat_template=TEMPLATE)


def conversation(lang: Language, tokens: list[int], answer_start: int | None = None) -> dict:
    """The chat record of a language sequence (BOS, header, body, EOS): user = tokens 1..answer_start−1 (default
    the header), assistant = the rest before EOS."""
    names = token_names(lang)
    c = lang.spec.header + 1 if answer_start is None else answer_start
    return {"messages": [{"role": "user", "content": " ".join(names[t] for t in tokens[1:c])},
                         {"role": "assistant", "content": " ".join(names[t] for t in tokens[c:-1])}]}


def build_model(lang: Language, recipe: TargetRecipe) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3 (seeded) with 256 embedding rows ≥ the language's ids (spare rows: DFlash's
    mask token)."""
    cfg = Qwen3Config(vocab_size=256, hidden_size=recipe.hidden, intermediate_size=4 * recipe.hidden,
                      num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
                      num_key_value_heads=recipe.heads, head_dim=recipe.hidden // recipe.heads,
                      max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=BOS,
                      eos_token_id=EOS, pad_token_id=EOS)
    torch.manual_seed(recipe.seed)
    return Qwen3ForCausalLM(cfg)


def batch_tensors(lang: Language, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] int64 (EOS padded) and labels [B, T] (-100 except body + EOS positions)."""
    width, h = max(map(len, seqs)), lang.spec.header
    ids = torch.full((len(seqs), width), EOS, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, h + 1:len(s)] = torch.tensor(s[h + 1:])
    return ids, labels


def true_entropy(lang: Language, seqs: list[list[int]]) -> float:
    """Mean exact cross-entropy −log p(x_t | x_<t) of the language on the body + EOS tokens of `seqs` (nats/token)."""
    total, n = 0.0, 0
    for s in seqs:
        parser, h = Parser(lang, s), lang.spec.header
        for t in range(h + 1, len(s)):
            total -= math.log(parser.probs(parser.states[t - 1])[s[t]])
            n += 1
    return total / n


@torch.no_grad()
def model_entropy(model, lang: Language, seqs: list[list[int]]) -> float:
    """The model's mean cross-entropy on the same tokens as `true_entropy` (nats/token)."""
    total, n = 0.0, 0
    for start in range(0, len(seqs), 32):
        ids, labels = batch_tensors(lang, seqs[start:start + 32])
        logits = model(input_ids=ids).logits[:, :-1].float()
        lab = labels[:, 1:]
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                                   ignore_index=-100, reduction="sum").item()
        n += int((lab != -100).sum())
    return total / n


def train_target(out: str | Path, spec: LanguageSpec = LanguageSpec(), recipe: TargetRecipe = TargetRecipe(),
                 heldout: int = 200, log=print) -> dict:
    """Trains the target on fresh sequences every step (corpus seed TRAIN_SEED), then writes `out` (model,
    tokenizer, testbed.json with the spec, recipe and held-out true vs model entropy). Returns that record.
    Deterministic for a given thread count."""
    lang = Language(spec)
    model = build_model(lang, recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, recipe.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, i / recipe.steps))))
    rng = random.Random(TRAIN_SEED)  # fresh sequences every step, drawn as they are needed
    model.train()
    t0 = time.time()
    for step in range(recipe.steps):
        ids, labels = batch_tensors(lang, [sample_sequence(lang, rng) for _ in range(recipe.batch)])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == recipe.steps - 1:
            log(f"target step {step}/{recipe.steps}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)")
    model.eval()
    held = sample_corpus(lang, heldout, HELDOUT_SEED)
    record = {"spec": asdict(spec), "recipe": asdict(recipe), "heldout_sequences": heldout,
              "true_entropy": true_entropy(lang, held), "model_entropy": model_entropy(model, lang, held),
              "train_seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads()}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    make_tokenizer(lang).save_pretrained(out)
    (out / "testbed.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_spec(target_dir: str | Path) -> LanguageSpec:
    """The LanguageSpec a synthetic target directory was trained on (its testbed.json); ValueError naming
    --target when the directory is not a synthetic target."""
    path = Path(target_dir) / "testbed.json"
    if not path.is_file():
        raise ValueError(f"--target {target_dir}: not a synthetic target (no testbed.json; make one with "
                         f"`flashmap testbed target --out DIR`)")
    return LanguageSpec(**json.loads(path.read_text())["spec"])
