"""Memory-lean logprobs: `LeanHeadFn` equals plain autograd (values and gradients, fp64), keeps no
[N, V] tensor for backward, and the trainer's gradient checkpointing and memory metric act."""

import copy
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_trainer import experiences, make_config
from transformers import AutoModelForCausalLM

from trinity.common.memory import PeakRss, TreePssSampler, tree_pss_bytes
from trinity.config import load_config
from trinity.models.lean_head import head_logprobs, lean_head_logprobs
from trinity.trainer.batch import collate
from trinity.trainer.logprobs import response_logprobs
from trinity.trainer.trainer import Trainer

TOL = dict(rtol=1e-10, atol=1e-12)  # fp64: the two paths differ only by summation order


def plain_reference(h, labels, weight, bias):
    """Every logit at once, under plain autograd: log p[label] and H = −Σ p log p."""
    logp = torch.log_softmax(h @ weight.T + bias, dim=-1)  # [N, V]
    return logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def leaves(n=37, hid=8, vocab=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hid, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(vocab, hid, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(vocab, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=g)
    return h, w, b, labels


@pytest.mark.parametrize("chunk", [1, 10, 64])  # one row, a chunk that does not divide 37, all
@pytest.mark.parametrize("ent_coef", [0.0, 0.7])  # entropy bonus off (its gradient skipped) / on
def test_lean_head_equals_plain_autograd(chunk, ent_coef):
    h, w, b, labels = leaves()
    a = torch.randn(h.shape[0], dtype=torch.float64)  # an arbitrary upstream gradient
    lp_ref, ent_ref = plain_reference(h, labels, w, b)
    torch.autograd.backward((a * lp_ref + ent_coef * ent_ref).sum(), inputs=[h, w, b])
    want = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    lp, ent = lean_head_logprobs(h, labels, w, b, chunk_size=chunk)
    torch.testing.assert_close(lp, lp_ref, **TOL)
    torch.testing.assert_close(ent, ent_ref, **TOL)
    torch.autograd.backward((a * lp + ent_coef * ent).sum(), inputs=[h, w, b])
    for t, ref in zip((h, w, b), want, strict=True):
        torch.testing.assert_close(t.grad, ref, **TOL)


def test_lean_head_passes_gradcheck_without_bias_and_entropy():
    # finite differences against the closed-form backward, independent of any autograd graph
    h, w, _, labels = leaves(n=5, hid=3, vocab=7)
    assert torch.autograd.gradcheck(lambda h, w: lean_head_logprobs(h, labels, w, None, 2), (h, w))
    lp, ent = lean_head_logprobs(h, labels, w, None, 2, with_entropy=False)
    assert ent is None
    torch.testing.assert_close(lp, plain_reference(h, labels, w, torch.zeros(7).double())[0])


def test_response_logprobs_lean_equals_plain_on_the_tiny_model(tiny_model_dir):
    """logprobs, entropy and every parameter's gradient (head weight tied to the embeddings, the
    backbone through the hidden states) agree between the lean and the plain path, fp64."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    batch = collate(experiences(model.config.vocab_size), pad_id=0)
    results = []
    for lean in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, batch, chunk_size=7, lean=lean)
        # GRPO-like: advantage-weighted logprobs plus an entropy bonus
        w = torch.linspace(-1, 1, lp.numel(), dtype=torch.float64).view_as(lp)
        ((w * lp).sum() + 0.3 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((lp.detach(), ent.detach(), grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, **TOL)
    torch.testing.assert_close(ent1, ent0, **TOL)
    assert g0.keys() == g1.keys() and "lm_head.weight" not in g0  # tied: one weight
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-9, atol=1e-11, msg=name)


class SavedBytes:
    """Bytes autograd saves for backward (parameters excluded), by storage."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.storages: dict[int, int] = {}

    def pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.params:
            self.storages[ptr] = t.untyped_storage().nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def big_vocab_head(n=1024, hid=32, vocab=50_000):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hid, vocab, bias=False)
    torch.nn.init.normal_(head.weight, generator=g)
    h = torch.randn(n, hid, generator=g).requires_grad_()
    return head, h, torch.randint(0, vocab, (n,), generator=g)


def test_lean_head_keeps_no_logits_for_backward():
    """What autograd holds between forward and backward: the plain path at least the fp32
    logits and their log_softmax, 2 × N × V × 4 = 2 × 1024 × 50,000 × 4 B = 409.6 MB; the lean
    path h [N, H], labels, log-sum-exp and entropy: (32 × 4 + 8 + 4 + 4) × 1024 B = 147 KB."""
    head, h, labels = big_vocab_head()
    n, vocab = 1024, 50_000
    saved = {}
    for lean in (False, True):
        rec = SavedBytes(head.parameters())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            lp, ent = head_logprobs(head, h, labels, chunk_size=128, lean=lean)
        (lp.sum() + ent.sum()).backward()
        saved[lean] = rec.total
    assert saved[False] >= 2 * n * vocab * 4
    assert saved[True] <= (32 * 4 + 8 + 4 + 4) * n


@pytest.mark.skipif(
    not PeakRss().reset() or not hasattr(ctypes.CDLL(None), "malloc_trim"),
    reason="needs /proc/self/clear_refs (Linux) and glibc",
)
def test_lean_head_peak_rss_is_below_the_plain_path():
    """The process's peak RSS over forward + backward (kernel high-water mark, reset before
    each, after a first unmeasured pass of both): plain holds ≥ 2 × 204.8 MB of logits at once;
    lean about three 128-row chunks, 3 × 128 × 50,000 × 4 B = 76.8 MB. Measured in a fresh
    process whose allocator maps every block of 1 MB or more (`MALLOC_MMAP_THRESHOLD_`), so a
    freed chunk leaves RSS at once: with glibc's moving threshold the 25.6 MB chunks went to the
    heap and the lean rise read 365-416 MB (failing the bound twice); mapped, it reads 83 MB
    against the plain path's 742 MB."""
    r = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rise = {lean == "True": v for lean, v in json.loads(r.stdout.splitlines()[-1]).items()}
    assert rise[False] >= 2 * 1024 * 50_000 * 4
    assert rise[True] < rise[False] / 3, rise


PEAK_RSS_PROBE = """
import ctypes, json, sys
sys.path.insert(0, ".")
sys.path.insert(0, "..")
from test_lean_head import big_vocab_head, _rss
from trinity.common.memory import PeakRss
from trinity.models.lean_head import head_logprobs

head, h, labels = big_vocab_head()
peak = PeakRss()
rise = {}
for lean in (True, False):  # once unmeasured: one-time allocations (thread pools, kernels'
    h.grad = head.weight.grad = None  # workspaces) a process makes on its first use
    lp, ent = head_logprobs(head, h, labels, chunk_size=128, lean=lean)
    (lp.sum() + ent.sum()).backward()
    del lp, ent
for lean in (True, False):
    h.grad = head.weight.grad = None
    ctypes.CDLL(None).malloc_trim(0)  # freed heap pages back to the OS: a clean baseline
    base = _rss()
    peak.reset()
    lp, ent = head_logprobs(head, h, labels, chunk_size=128, lean=lean)
    (lp.sum() + ent.sum()).backward()
    del lp, ent
    rise[str(lean)] = peak.peak_bytes() - base
print(json.dumps(rise))
"""


def _rss() -> int:
    from trinity.common.memory import rss_bytes

    rss = rss_bytes()
    assert rss is not None
    return rss


def test_gradient_checkpointing_is_acted_on_and_exact(tmp_path, tiny_model_dir):
    """trainer.enable_gradient_checkpointing turns HF's checkpointing on; one train step gives
    the same parameters as without it (the recomputed forward is the same arithmetic)."""
    exps = experiences(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)
    after, metrics = [], []
    for on in ("false", "true"):
        cfg = make_config(tmp_path, tiny_model_dir, enable_gradient_checkpointing=on)
        trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
        layer = trainer.model.model.layers[0]  # HF marks each checkpointed layer
        assert bool(getattr(layer, "gradient_checkpointing", False)) == (on == "true")
        metrics.append(trainer.train_step(copy.deepcopy(exps)))
        after.append(trainer.model.state_dict())
    for name in after[0]:
        torch.testing.assert_close(after[1][name], after[0][name], rtol=1e-5, atol=1e-6)
    for m in metrics:  # this process's peak during the step: at least the model's weights
        n_bytes = sum(t.numel() * 4 for t in after[0].values())
        assert m["memory/trainer_peak_rss_gb"] * 1024**3 > n_bytes


def test_lean_lm_head_key_is_acted_on_and_exact(tmp_path, tiny_model_dir, monkeypatch):
    """trainer.lean_lm_head routes the train step's head through LeanHeadFn (the no-grad old and
    reference logprobs need no backward and stay plain); one step lands on the same parameters."""
    from trinity.models import lean_head

    calls = []
    original = lean_head.LeanHeadFn.apply
    monkeypatch.setattr(lean_head.LeanHeadFn, "apply", lambda *a: calls.append(1) or original(*a))
    exps = experiences(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)
    after = []
    for on in ("false", "true"):
        calls.clear()
        cfg = make_config(tmp_path, tiny_model_dir, lean_lm_head=on)
        trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
        trainer.train_step(copy.deepcopy(exps))
        assert bool(calls) == (on == "true"), (on, len(calls))
        after.append(trainer.model.state_dict())
    # Adam's first step moves every entry by about lr * g / (|g| + eps): an entry whose gradient
    # is rounding noise moves by ~lr in a direction the noise sets, which the two head paths
    # round differently. Such entries exist: the key projection's bias has a zero gradient in
    # exact arithmetic (adding q.b to every score of a row leaves its softmax unchanged), and
    # rows of the vocabulary no token predicts have gradients near eps. Measured: 24 of the
    # model's entries differ by more than lr/1000, the largest by 1.6e-4. A wrong gradient moves
    # most entries by ~lr. (The gradients themselves: the test above.)
    lr = 1e-2
    diffs = torch.cat([(after[1][k] - after[0][k]).abs().flatten() for k in after[0]])
    assert int((diffs > lr / 100).sum()) <= diffs.numel() // 10_000, int((diffs > lr / 100).sum())
    assert float(diffs.median()) < 1e-7


def test_verl_gradient_checkpointing_key_sets_ours(tmp_path, tiny_model_dir):
    p = Path(tmp_path) / "verl.yaml"
    p.write_text(
        f"model: {{model_path: {tiny_model_dir}}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 2}\n"
        "trainer: {trainer_config: {actor_rollout_ref: {model: "
        "{enable_gradient_checkpointing: true}}}}\n"
        "buffer: {batch_size: 2, explorer_input: {taskset: {storage_type: synthetic, "
        "path: arithmetic}}}\n"
    )
    assert load_config(p).trainer.enable_gradient_checkpointing is True


def test_tree_pss_counts_a_child_process():
    """A child holding 200 MB of touched memory adds about that much to its parent's tree PSS."""
    import os
    import subprocess
    import sys
    import time

    from trinity.common.memory import _pss_bytes

    def others() -> int:  # the tree less this process, whose own heap may shrink meanwhile (an
        # earlier test's trainer trimming it once idle)
        return tree_pss_bytes(os.getpid()) - _pss_bytes(os.getpid())

    code = "import sys; b = b'x' * (200 * 2**20); sys.stdout.write('x'); sys.stdout.flush(); sys.stdin.read()"
    before, before_tree, own = others(), tree_pss_bytes(os.getpid()), _pss_bytes(os.getpid())
    sampler = TreePssSampler(os.getpid(), interval=0.05).start()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.read(1) == b"x"
        time.sleep(0.1)
        grew = others() - before
    finally:
        child.communicate(b"")
    assert 200 * 2**20 <= grew <= 260 * 2**20
    # the sampler saw the child while it lived, over what this process kept of its own share
    shrank = max(0, own - _pss_bytes(os.getpid()))
    assert sampler.stop() - (before_tree - shrank) >= 200 * 2**20
