"""`flashmap eval --state-probe`: is the FlashMap flow state informative where its clock says it is?

Per clock value τ (interpolant time t = clock.t_of_tau(τ)), on the held-out sequences' scored anchors
(`heldout.anchors`), with the true next K tokens y placed in the slot states x_t = (1−t)·z + t·E[y]
(z ~ N(0, EᵀE), the training interpolant, DESIGN.md §4):

- design: τ + (1−τ)/V_s, the accuracy the clock promises a uniform-prior reader of the state;
- reader_uniform: the exact uniform-prior (Bayes) reader of the network's actual input Eᵀx_t, y drawn
  uniformly from the V_s state rows (what the clock is calibrated against; Monte Carlo);
- reader_heldout: the same reader on the held-out labels (the data's token frequencies);
- network_slot1 / network_all: top-1 accuracy of the drafter's own prediction net(x_t, τ, τ) (slot 1 /
  every slot), i.e. how much of its state the network reads;
- prior_plus_reader_slot1: argmax of log softmax net(z, 0, 0) + log p(Eᵀx_t | y): the network's
  context-only prediction combined exactly with the state's likelihood (what reading the state could add).

Accuracies count valid (in-vocabulary) labels; `n` gives the counts (anchors of a sequence are correlated).
"""
from __future__ import annotations

from typing import Sequence

import torch

from flashmap_ext.drafters.flashmap.flow import reader_accuracy, whitened_rows
from flashmap_ext.evaluate.heldout import HeldoutSequence, _select_taps, anchors

DEFAULT_TAUS = (0.0, 0.25, 0.5, 0.75, 0.9, 0.99)


def reader_uniform(drafter, taus: Sequence[float], samples: int = 4096, seed: int = 1) -> list[float]:
    """Accuracy of the exact uniform-prior reader of Eᵀx_t at each τ of the drafter's clock, y uniform
    over the V_s state rows, `samples` Monte-Carlo draws from a CPU generator seeded with `seed`."""
    rows = whitened_rows(drafter.tables.state_embedding)
    g = torch.Generator(device="cpu").manual_seed(seed)
    labels = torch.randint(0, rows.shape[0], (samples,), generator=g)
    xi = torch.randn(samples, rows.shape[1], generator=g, dtype=torch.float64)
    t = drafter.clock.t_of_tau(torch.tensor(list(taus), dtype=torch.float64))
    return reader_accuracy(rows.cpu(), t.cpu(), labels, xi).tolist()


@torch.no_grad()
def _sequence_counts(drafter, s: HeldoutSequence, taus, k: int, stride: int, generator, dtype) -> torch.Tensor:
    """[len(taus), 6] counts of one sequence: reader hits, network slot-1 hits, network hits, prior+reader
    slot-1 hits, valid slot-1 labels, valid labels (see `probe`)."""
    scored = anchors(s, k, stride)
    out = torch.zeros(len(taus), 6, dtype=torch.float64)
    if not scored:
        return out
    device = drafter.slot_pos.device
    ids = torch.tensor([s.input_ids], device=device)
    taps = _select_taps(s, drafter.target_layer_ids)[None].to(device=device, dtype=dtype or torch.float32)
    pos = torch.tensor([scored], device=device)
    labels = torch.stack([ids[0, a + 1:a + 1 + k] for a in scored])[None]  # [1, A, K] target ids
    state = drafter.to_state_ids(labels)
    valid = state >= 0
    xi = torch.randn(*labels.shape, drafter.config.d_target, generator=generator).to(device)
    z, data = drafter.noise_from_xi(xi), drafter.embed_tokens(labels)
    zeros = torch.zeros(pos.shape, device=device)
    prior = torch.log_softmax(drafter.forward_train(taps, ids, pos, z, zeros, zeros), -1)
    for i, tau in enumerate(taus):
        t = float(drafter.clock.t_of_tau(float(tau)))
        x = (1.0 - t) * z + t * data
        tau_b = torch.full(pos.shape, float(tau), device=device)
        net = drafter.forward_train(taps, ids, pos, x, tau_b, tau_b).argmax(-1)
        ll = drafter.state_log_likelihood(x, drafter.clock.t_of_tau(tau_b.double()))  # as config.state_loglik
        hits = [ll.argmax(-1) == state, net == state, net == state, (prior + ll).argmax(-1) == state]
        masks = [valid, valid[..., :1], valid, valid[..., :1]]
        for j, (h, m) in enumerate(zip(hits, masks)):
            h = h[..., :1] if m.shape[-1] == 1 else h
            out[i, j] = float((h & m).sum())
        out[i, 4], out[i, 5] = float(valid[..., 0].sum()), float(valid.sum())
    return out


def probe(drafter, seqs: Sequence[HeldoutSequence], taus: Sequence[float] = DEFAULT_TAUS, *, k: int | None = None,
          stride: int = 1, seed: int = 0, reader_samples: int = 4096, dtype=None) -> dict:
    """The state probe of one FlashMap drafter (module docstring) on sequences with taps (`add_taps`).

    taus: clock values in [0, 1); k: slots (default the drafter's K); stride: score every N-th anchor;
    seed: the slot noise (CPU generator); reader_samples: Monte-Carlo draws of reader_uniform.
    Returns {"clock", "t_mid", "state_rows", "rows": [{tau, t, design, reader_uniform, reader_heldout,
    network_slot1, network_all, prior_plus_reader_slot1, n_slot1, n_all}]}. ValueError for τ outside [0, 1).
    """
    taus = [float(x) for x in taus]
    if not taus or any(not 0.0 <= x < 1.0 for x in taus):
        raise ValueError(f"taus: expected values in [0, 1), got {taus}")
    k = k or drafter.num_draft_tokens
    g = torch.Generator(device="cpu").manual_seed(seed)
    was_training = drafter.training
    drafter.eval()
    try:
        counts = sum(_sequence_counts(drafter, s, taus, k, stride, g, dtype) for s in seqs)
    finally:
        drafter.train(was_training)
    uniform = reader_uniform(drafter, taus, reader_samples)
    V = drafter.config.state_vocab_size
    rows = []
    for i, tau in enumerate(taus):
        c = counts[i] if torch.is_tensor(counts) else torch.zeros(6, dtype=torch.float64)
        n1, n = max(float(c[4]), 1.0), max(float(c[5]), 1.0)
        rows.append({"tau": tau, "t": float(drafter.clock.t_of_tau(tau)), "design": tau + (1 - tau) / V,
                     "reader_uniform": uniform[i], "reader_heldout": float(c[0]) / n,
                     "network_slot1": float(c[1]) / n1, "network_all": float(c[2]) / n,
                     "prior_plus_reader_slot1": float(c[3]) / n1, "n_slot1": int(c[4]), "n_all": int(c[5])})
    return {"clock": drafter.clock.name, "t_mid": drafter.t_mid, "state_rows": V, "rows": rows}


def markdown(results: dict, meta: dict) -> str:
    """One table per drafter, with the command, machine, dtype and date under them."""
    cols = ("tau", "t", "design", "reader_uniform", "reader_heldout", "network_slot1", "network_all",
            "prior_plus_reader_slot1")
    lines = []
    for name, r in results.items():
        lines += [f"### {name}: clock {r['clock']} (t at τ = ½: {r['t_mid']:.4f}, {r['state_rows']} state rows)", "",
                  "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(f"{row[c]:.4f}" for c in cols) + " |" for row in r["rows"]]
        n = r["rows"][0]
        lines += ["", f"n = {n['n_slot1']} slot-1 labels, {n['n_all']} labels (held-out, in the draft vocabulary).", ""]
    lines.append(f"Command: `{meta['command']}`; target {meta['target']} in {meta['dtype']}; {meta['cpu']}, "
                 f"{meta['torch_threads']} torch thread(s); {meta['date']}.")
    return "\n".join(lines) + "\n"
