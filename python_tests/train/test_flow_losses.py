"""Flow CE loss and semigroup distillation loss of the FlashMap drafter (DESIGN.md §4)."""
import math

import pytest
import torch

from conftest import tiny_qwen3
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.drafters.flashmap.flow import flow_map_jump, t_of_tau
from flashmap_ext.train.distill import assign_roles, distill_loss, make_student, sample_times
from flashmap_ext.train.flow import block_taus, flow_loss, noisy_states, slot_weights, stratified_uniform

TINY = dict(n_layers=2, width=32, heads=4, block_size=4, cond_dim=16, target_layer_ids=(0, 2))


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3()


def make_flow(target, seed=0, zero_init=False, **kw):
    torch.manual_seed(seed)
    drafter = FlashMapDrafter.for_target(target, **{**TINY, "two_time": False, **kw})
    drafter.reset_parameters(zero_init=zero_init)
    return drafter


def make_batch(drafter, B=2, T=16, A=4, seed=0):
    """Random sequence, random sorted anchors (row 1's last block padded with −1), labels = next K tokens."""
    g = torch.Generator().manual_seed(seed)
    K, F = drafter.config.block_size, len(drafter.target_layer_ids) * drafter.config.d_target
    ids = torch.randint(0, drafter.config.vocab_size, (B, T), generator=g)
    anchors = torch.stack([torch.randperm(T - 1, generator=g)[:A].sort().values for _ in range(B)])
    if B > 1:
        anchors[1, -1] = -1
    pos = anchors[..., None] + 1 + torch.arange(K)
    labels = torch.where((pos < T) & (anchors[..., None] >= 0), ids.gather(1, pos.clamp(0, T - 1).view(B, -1)).view(B, A, K), -100)
    return {"input_ids": ids, "taps": torch.randn(B, T, F, generator=g).bfloat16(), "anchor_pos": anchors,
            "labels": labels}


def test_slot_weights_and_stratified_tau():
    assert slot_weights(16).tolist() == pytest.approx([math.exp(-k / 7) for k in range(16)])
    u = stratified_uniform(1000, torch.Generator().manual_seed(0))
    assert sorted((u * 1000).floor().long().tolist()) == list(range(1000)), "one draw per stratum"


def test_tau0_frac_puts_that_share_of_blocks_at_pure_noise(target):
    tau = block_taus(8, 25, torch.Generator().manual_seed(1), tau0_frac=0.25)
    assert tau.shape == (8, 25) and int((tau == 0).sum()) == 50
    assert (tau[tau > 0] < 1).all() and float(tau[tau > 0].std()) > 0.2, "the rest stays spread over (0, 1)"
    assert float(block_taus(4, 4, torch.Generator().manual_seed(0), 0.0).min()) > 0
    with pytest.raises(ValueError, match="tau0_frac"):
        block_taus(2, 2, torch.Generator(), 1.5)
    # τ = 0 everywhere: x_t is pure noise, so the loss cannot depend on the labels' embeddings
    drafter = make_flow(target)
    batch = make_batch(drafter)
    _, m = flow_loss(drafter, batch, torch.Generator().manual_seed(0), tau0_frac=1.0)
    assert m["tau_mean"] == 0.0
    x0 = noisy_states(drafter, batch["labels"], torch.zeros(2, 4), torch.Generator().manual_seed(3))
    x0b = noisy_states(drafter, batch["labels"].flip(-1), torch.zeros(2, 4), torch.Generator().manual_seed(3))
    torch.testing.assert_close(x0, x0b, rtol=0, atol=0)


def test_flow_loss_is_finite_and_trains_only_the_drafter(target):
    drafter = make_flow(target)
    loss, metrics = flow_loss(drafter, make_batch(drafter), torch.Generator().manual_seed(0))
    assert loss.dim() == 0 and torch.isfinite(loss) and loss.requires_grad
    assert set(metrics) >= {"loss", "acc", "accept_len", "tokens", "tau_mean"} and metrics["tokens"] > 0
    loss.backward()
    assert drafter.tap_proj.weight.grad.abs().sum() > 0 and drafter.slot_proj.weight.grad.abs().sum() > 0
    assert target.lm_head.weight.grad is None and target.get_input_embeddings().weight.grad is None


def test_flow_loss_ignores_features_at_or_after_the_anchor(target):
    drafter = make_flow(target)
    batch = make_batch(drafter, B=1, A=1)
    batch["anchor_pos"], batch["labels"] = torch.tensor([[7]]), batch["input_ids"][:, 8:12].reshape(1, 1, 4)
    base = flow_loss(drafter, batch, torch.Generator().manual_seed(3))[0]
    late = dict(batch, taps=batch["taps"].clone())
    late["taps"][0, 7:] = torch.randn_like(late["taps"][0, 7:].float()).bfloat16()
    assert flow_loss(drafter, late, torch.Generator().manual_seed(3))[0].item() == base.item()
    early = dict(batch, taps=batch["taps"].clone())
    early["taps"][0, :7] = torch.randn_like(early["taps"][0, :7].float()).bfloat16()
    assert flow_loss(drafter, early, torch.Generator().manual_seed(3))[0].item() != base.item()


def _overfit(model, loss_fn, batch, steps, lr):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss, _ = loss_fn(model, batch, torch.Generator().manual_seed(1))  # fixed τ and noise
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_flow_loss_decreases_on_a_tiny_overfit_problem(target):
    drafter = make_flow(target, zero_init=True)
    losses = _overfit(drafter, flow_loss, make_batch(drafter), steps=40, lr=3e-3)
    assert losses[0] == pytest.approx(math.log(111), rel=1e-3), "adaLN-Zero starts at uniform logits"
    assert losses[-1] < 0.5 * losses[0], losses


def test_student_starts_as_the_teachers_euler_step(target):
    teacher = make_flow(target)
    student = make_student(teacher)
    assert student.config.two_time and not teacher.config.two_time
    extra = sum(p.numel() for p in student.t_embedder.parameters())
    assert sum(p.numel() for p in student.parameters()) == sum(p.numel() for p in teacher.parameters()) + extra
    batch = make_batch(teacher)
    g = torch.Generator().manual_seed(4)
    tau_s, tau_t = torch.rand(2, 4, generator=g) * 0.5, 0.5 + torch.rand(2, 4, generator=g) * 0.5
    s, t = t_of_tau(tau_s, 111), t_of_tau(tau_t, 111)
    x_s = noisy_states(teacher, batch["labels"], s, g)
    args = (batch["taps"], batch["input_ids"], batch["anchor_pos"], x_s)
    delta = torch.softmax(student.forward_train(*args, tau_s, tau_t), -1)
    d_s = torch.softmax(teacher.forward_train(*args, tau_s, tau_s), -1)
    assert torch.allclose(delta, d_s, atol=1e-6), "δ_{s,t} = D_s at initialisation"
    emb = target.get_input_embeddings().weight
    s4, t4 = s[..., None, None], t[..., None, None]
    euler = x_s + (t4 - s4) * (d_s @ emb - x_s) / (1 - s4)  # x + (t−s)·b_s(x), b_s = (D_s − x)/(1−s)
    jump = flow_map_jump(x_s, student.probs_to_state(delta), s[..., None].expand(2, 4, 4), t[..., None].expand(2, 4, 4))
    assert torch.allclose(jump, euler, atol=1e-5)
    with torch.no_grad():
        student.t_embedder.mlp[2].bias.normal_()
    assert not torch.allclose(torch.softmax(student.forward_train(*args, tau_s, tau_t), -1), d_s, atol=1e-4)
    with pytest.raises(ValueError, match="teacher"):
        make_student(student)


def test_roles_and_times():
    g = torch.Generator().manual_seed(0)
    zero, one = assign_roles(4, 8, 1 / 16, g)
    assert int(zero.sum()) == 16 and (zero.all(0) | ~zero.any(0)).all(), "half the blocks, whole columns"
    assert int(one.sum()) == 2 and not (one & zero).any()
    tau_s, tau_t = sample_times(zero, one, g)
    assert torch.equal(tau_s[zero], tau_t[zero])
    assert (tau_s[one] == 0).all() and (tau_t[one] == 1).all()
    rest = ~zero & ~one
    assert (tau_t[rest] > tau_s[rest]).all() and (tau_t[rest] <= 1).all() and (tau_s[rest] >= 0).all()
    zero1, _ = assign_roles(6, 1, 0.0, g)
    assert int(zero1.sum()) == 3, "A = 1: half the rows"


def _only(batch, keep):
    """The batch with labels masked outside the blocks in `keep` [B, A] bool."""
    return dict(batch, labels=torch.where(keep[..., None], batch["labels"], -100))


def test_zero_length_blocks_use_the_teacher_posterior(target):
    teacher, other = make_flow(target, seed=0), make_flow(target, seed=1)
    student = make_student(teacher)
    batch = make_batch(teacher, A=4)
    zero, _ = assign_roles(2, 4, 1 / 16, torch.Generator().manual_seed(7))  # the roles distill_loss will draw
    loss, metrics = distill_loss(student, teacher, _only(batch, zero), torch.Generator().manual_seed(7))
    loss.backward()
    grad = max(p.grad.abs().max().item() for p in student.parameters() if p.grad is not None)
    assert grad < 1e-5, "at init the student's δ_{t,t} equals the teacher's D: soft CE is at its minimum"
    student.zero_grad()
    loss_other, _ = distill_loss(student, other, _only(batch, zero), torch.Generator().manual_seed(7))
    loss_other.backward()
    assert max(p.grad.abs().max().item() for p in student.parameters() if p.grad is not None) > 1e-3
    _, m1 = distill_loss(student, teacher, batch, torch.Generator().manual_seed(7))
    _, m2 = distill_loss(student, other, batch, torch.Generator().manual_seed(7))
    assert m1["loss_jump"] == m2["loss_jump"] and m1["loss_zero"] != m2["loss_zero"], "teacher only on zero-length"


def test_jump_blocks_match_a_hand_computed_semigroup_target(target):
    teacher = make_flow(target)
    student = make_student(teacher)
    with torch.no_grad():
        student.t_embedder.mlp[2].weight.normal_(std=0.5)  # a student whose δ depends on τ_t
    batch = make_batch(teacher, B=1, A=2)
    batch["anchor_pos"][0, 1] = 9
    g = torch.Generator().manual_seed(11)
    zero, one = assign_roles(1, 2, 0.0, g)
    tau_s, tau_t = sample_times(zero, one, g)
    col = int((~zero[0]).nonzero()[0])
    s, u, t = (t_of_tau(x, 111) for x in (tau_s, (tau_s + tau_t) / 2, tau_t))
    x_s = noisy_states(student, batch["labels"], s, g)
    args = (batch["taps"], batch["input_ids"], batch["anchor_pos"])
    with torch.no_grad():
        a = torch.softmax(student.forward_train(*args, x_s, tau_s.float(), ((tau_s + tau_t) / 2).float()), -1)
        emb = target.get_input_embeddings().weight
        s4, u4, t4 = s[..., None, None], u[..., None, None], t[..., None, None]
        x_su = (1 - u4) / (1 - s4) * x_s + (u4 - s4) / (1 - s4) * (a @ emb)
        b = torch.softmax(student.forward_train(*args, x_su.float(), ((tau_s + tau_t) / 2).float(), tau_t.float()), -1)
        gamma = (1 - t4) * (u4 - s4) / ((1 - u4) * (t4 - s4))
        target_p = (gamma * a + (1 - gamma) * b)[0, col]
        logp = torch.log_softmax(student.forward_train(*args, x_s, tau_s.float(), tau_t.float()), -1)[0, col]
        w = slot_weights(4) * (batch["labels"][0, col] != -100)
        expected = ((-(target_p * logp).sum(-1)) * w).sum() / w.sum()
    _, metrics = distill_loss(student, teacher, batch, torch.Generator().manual_seed(11), 0.0)
    assert metrics["loss_jump"] == pytest.approx(expected.item(), rel=1e-5)


def _zero_to_one(target, gated: bool = True):
    """(teacher, student, batch, teacher D(·, 0), student log δ_{0,1}) for a qwen3-trunk student (τ-gated or not)
    whose δ_{0,1} is no longer the teacher's, on a batch scored at its 0→1 blocks only (the roles distill_loss
    draws with seed 5 and frac_01 0.5), from one noise draw (a gated student's logits do not depend on it)."""
    teacher = make_flow(target, trunk="qwen3", width=64, kv_heads=2, tau_gated_input=gated)
    student = make_student(teacher)
    with torch.no_grad():
        student.t_embedder.mlp[2].weight.normal_(std=0.5)
    batch = make_batch(teacher, A=4)
    zero, one = assign_roles(2, 4, 0.5, torch.Generator().manual_seed(5))
    batch = _only(batch, one)
    args = (batch["taps"], batch["input_ids"], batch["anchor_pos"])
    with torch.no_grad():
        x0 = noisy_states(student, batch["labels"], torch.zeros(2, 4, dtype=torch.float64),
                          torch.Generator().manual_seed(0))
        zeros, ones = torch.zeros(2, 4), torch.ones(2, 4)
        d0 = torch.softmax(teacher.forward_train(*args, x0, zeros, zeros), -1)
        logp = torch.log_softmax(student.forward_train(*args, x0, zeros, ones), -1)
    return teacher, student, batch, d0, logp


@pytest.mark.parametrize("gated", [True, False])
def test_a_gated_students_zero_to_one_jumps_take_the_teachers_first_step(target, gated):
    """With `tau_gated_input` the student's δ_{0,1} is context-only: its target is the teacher's D(·, 0),
    not the two half-jumps (which a non-gated student keeps)."""
    teacher, student, batch, d0, logp = _zero_to_one(target, gated)
    with torch.no_grad():
        w = slot_weights(4) * (batch["labels"] != -100)
        expected = ((-(d0 * logp).sum(-1)) * w).sum() / w.sum()
    _, metrics = distill_loss(student, teacher, batch, torch.Generator().manual_seed(5), 0.5)
    if gated:  # context-only: the noise draw does not matter, so x0 above need not be distill_loss's
        assert metrics["loss_jump"] == pytest.approx(expected.item(), rel=1e-5)
    else:
        assert abs(metrics["loss_jump"] - expected.item()) > 1e-3


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_data_weight_mixes_the_label_into_the_teachers_targets(target, weight):
    """data_weight w: a gated student's 0→1 blocks take (1 − w)·D(·, 0) + w·onehot(label), so their soft CE is
    (1 − w)·CE against the teacher + w·CE against the data label (hard CE, computed by hand)."""
    teacher, student, batch, d0, logp = _zero_to_one(target)
    with torch.no_grad():
        ids = student.to_state_ids(batch["labels"])
        hard = -logp.gather(-1, ids.clamp_min(0)[..., None])[..., 0]
        per_slot = (1 - weight) * (-(d0 * logp).sum(-1)) + weight * hard
        w = slot_weights(4) * (ids != -100)
        expected = (per_slot * w).sum() / w.sum()
    _, metrics = distill_loss(student, teacher, batch, torch.Generator().manual_seed(5), 0.5, data_weight=weight)
    assert metrics["loss_jump"] == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="data_weight"):
        distill_loss(student, teacher, batch, torch.Generator().manual_seed(5), 0.5, data_weight=1.5)


def test_distill_reachable_keeps_the_slots_verification_reaches(target):
    """reachable: a gated student's 0→1 blocks are scored only at slot 1 and at the slots after a right draft
    prefix (the student's argmax against the labels, checked slot by slot here)."""
    teacher, student, batch, d0, logp = _zero_to_one(target)
    with torch.no_grad():
        pred = logp.argmax(-1)  # context-only: the labels below do not change it
        for a in range(4):  # row 0, block a: its first a slots drafted right (where the block is scored)
            keep = batch["labels"][0, a, :a] != -100
            batch["labels"][0, a, :a] = torch.where(keep, student.to_target_ids(pred[0, a, :a]), -100)
        ids = student.to_state_ids(batch["labels"])
        ce, w_all = -(d0 * logp).sum(-1), slot_weights(4)
        num = den = 0.0
        for b in range(2):
            for a in range(4):
                for k in range(4):
                    prefix_right = all(int(pred[b, a, j]) == int(ids[b, a, j]) for j in range(k))
                    if ids[b, a, k] != -100 and prefix_right:
                        num, den = num + float(w_all[k] * ce[b, a, k]), den + float(w_all[k])
    plain, _ = distill_loss(student, teacher, batch, torch.Generator().manual_seed(5), 0.5)
    loss, _ = distill_loss(student, teacher, batch, torch.Generator().manual_seed(5), 0.5, reachable=True)
    assert loss.item() == pytest.approx(num / den, rel=1e-5) and abs(loss.item() - plain.item()) > 1e-4
    assert den > sum(float(w_all[0]) for b in range(2) for a in range(4) if ids[b, a, 0] != -100)  # past slot 1


def test_distill_loss_is_finite_and_decreases(target):
    teacher = make_flow(target)
    student = make_student(teacher)
    batch = make_batch(teacher)
    loss, metrics = distill_loss(student, teacher, batch, torch.Generator().manual_seed(0), frac_01=0.25)
    assert torch.isfinite(loss) and set(metrics) >= {"loss", "loss_zero", "loss_jump", "acc_01", "tokens"}
    losses = _overfit(student, lambda m, b, g: distill_loss(m, teacher, b, g, 0.25), batch, steps=25, lr=3e-3)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("trunk", [{}, {"trunk": "qwen3", "width": 64, "kv_heads": 2, "tau_gated_input": True}])
@torch.no_grad()
def test_rollout_weight_trains_the_two_step_drafts_second_evaluation(target, trunk):
    """rollout_weight = 1: the loss is the slot-weighted CE of the 2-step draft's logits, as the inference path
    (draft_flashmap, steps=2, one block at a time from a memory of its prefix) computes them from the same noise;
    rollout_reachable (and reachable, for the first evaluation's CE): only at slots whose 1-step draft prefix
    equals the labels (row 0's labels start with it)."""
    drafter = make_flow(target, **trunk).eval()
    batch = make_batch(drafter)
    g = torch.Generator().manual_seed(5)
    block_taus(2, 4, g, 1.0)  # the loss draws τ, then the noise (independent of the labels), from its generator
    z = noisy_states(drafter, batch["labels"], torch.zeros(2, 4), g)
    w, num, den, num_r, den_r, num_1, den_1 = slot_weights(4), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for b in range(2):
        for a, p in enumerate(batch["anchor_pos"][b].tolist()):
            if p < 0:
                continue
            memory = drafter.new_memory(1)
            if p:
                drafter.extend_memory(memory, batch["input_ids"][b:b + 1, :p], batch["taps"][b:b + 1, :p])
            anchor = batch["input_ids"][b, p:p + 1]
            one = draft_flashmap(drafter, memory, anchor, steps=1, noise=z[b, a:a + 1], return_logits=True)
            first, logits_1 = one.tokens[0], one.logits[0].double()
            if b == 0:
                batch["labels"][0, a, :a] = first[:a]  # block a: its first a slots drafted right
            logits = draft_flashmap(drafter, memory, anchor, steps=2, noise=z[b, a:a + 1],
                                    return_logits=True).logits[0].double()
            for k, y in enumerate(batch["labels"][b, a].tolist()):
                if y >= 0:
                    ce = float(w[k]) * float(torch.logsumexp(logits[k], 0) - logits[k, y])
                    num, den = num + ce, den + float(w[k])
                    if torch.equal(first[:k], batch["labels"][b, a, :k]):  # verification reaches slot k
                        num_r, den_r = num_r + ce, den_r + float(w[k])
                        ce_1 = float(w[k]) * float(torch.logsumexp(logits_1[k], 0) - logits_1[k, y])
                        num_1, den_1 = num_1 + ce_1, den_1 + float(w[k])
    loss, m = flow_loss(drafter, batch, torch.Generator().manual_seed(5), tau0_frac=1.0, rollout_weight=1.0)
    assert loss.item() == pytest.approx(num / den, rel=1e-4)
    assert m["step2_loss"] == pytest.approx(num / den, rel=1e-4) and 0 <= m["step2_acc"] <= 1
    reach, _ = flow_loss(drafter, batch, torch.Generator().manual_seed(5), tau0_frac=1.0, rollout_weight=1.0,
                         rollout_reachable=True)
    assert den_r < den and reach.item() == pytest.approx(num_r / den_r, rel=1e-4)
    reach_1, _ = flow_loss(drafter, batch, torch.Generator().manual_seed(5), tau0_frac=1.0, reachable=True)
    assert reach_1.item() == pytest.approx(num_1 / den_1, rel=1e-4)
    half, _ = flow_loss(drafter, batch, torch.Generator().manual_seed(5), tau0_frac=1.0, rollout_weight=0.5)
    one_step, _ = flow_loss(drafter, batch, torch.Generator().manual_seed(5), tau0_frac=1.0)
    assert half.item() == pytest.approx(0.5 * one_step.item() + 0.5 * num / den, rel=1e-4)


def test_rollout_weight_refusals(target):
    drafter = make_flow(target)
    batch = make_batch(drafter)
    for kw, match in [({"rollout_weight": 1.5, "tau0_frac": 1.0}, "rollout_weight must be in"),
                      ({"rollout_weight": 0.5}, "tau0_frac > 0"),
                      ({"tau0_frac": 1.0, "rollout_reachable": True}, "rollout_weight > 0")]:
        with pytest.raises(ValueError, match=match):
            flow_loss(drafter, batch, torch.Generator().manual_seed(0), **kw)
    with pytest.raises(ValueError, match="two-time"):
        flow_loss(make_student(drafter), batch, torch.Generator().manual_seed(0), tau0_frac=1.0, rollout_weight=0.5)
