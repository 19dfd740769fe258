"""Cores lent between a process's compute threads (`trinity.common.core_shares`)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from trinity.common.core_shares import CoreShares, follow_hooks, lending_is_reproducible


def test_an_idle_part_lends_its_threads_to_the_active_ones():
    shares = CoreShares(lend=True)
    engine, trainer = shares.join(1), shares.join(1)
    assert (engine.now(), trainer.now()) == (2, 2)  # neither active: each may take both
    with engine.active():  # the idle trainer lends its thread; the busy engine lends none
        assert (engine.now(), trainer.now()) == (2, 1)
        with trainer.active():
            assert (engine.now(), trainer.now()) == (1, 1)
        assert engine.now() == 2
    big = shares.join(2)
    with engine.active():
        assert engine.now() == 1 + 1 + 2
    shares.leave(big)
    with engine.active():
        assert engine.now() == 2
    del trainer  # its owner is gone (a finished stage's trainer): nothing left to lend
    gc.collect()
    with engine.active():
        assert engine.now() == 1


def test_without_lending_each_part_keeps_its_own():
    shares = CoreShares(lend=False)
    engine, trainer = shares.join(1), shares.join(3)
    with engine.active():
        assert (engine.now(), trainer.now()) == (1, 3)


def test_follow_sets_the_calling_threads_torch_count():
    shares = CoreShares(lend=True)
    part, other = shares.join(1), shares.join(1)
    seen = []

    def compute() -> None:  # torch's count is per thread: follow on the thread that computes
        with part.active():
            with other.active():
                part.follow()
                seen.append(torch.get_num_threads())
            part.follow()  # the other part went idle: its thread is lent
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=compute)
    t.start()
    t.join()
    assert seen == [1, 2]


def test_hooks_follow_before_each_layer_in_both_passes():
    import transformers

    config = transformers.Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)

    class Counting:
        calls = 0

        def follow(self) -> None:
            self.calls += 1

    part = Counting()
    handles = follow_hooks(model, part)  # type: ignore[arg-type]
    out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert part.calls == 3  # one per decoder layer, forward
    out.sum().backward()
    assert part.calls == 6  # and one per layer, backward
    for h in handles:
        h.remove()
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert part.calls == 6


def test_lending_needs_mkl_s_strict_reproducibility(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert not lending_is_reproducible()
    assert not CoreShares().lends()
    monkeypatch.setenv("MKL_CBWR", "AUTO,STRICT")
    assert lending_is_reproducible() == torch.backends.mkl.is_available()


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")
def test_under_strict_mkl_gradients_do_not_depend_on_the_thread_count():
    """What lending relies on: one and two threads give the same logits and gradients, bit for
    bit (MKL reads MKL_CBWR as it loads, so in a process of its own)."""
    script = textwrap.dedent(
        """
        import torch, transformers
        config = transformers.Qwen2Config(
            hidden_size=256, intermediate_size=768, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        ids = torch.randint(0, 300, (16, 48))
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model.zero_grad()
            logits = model(input_ids=ids).logits
            logits.logsumexp(-1).sum().backward()
            runs.append([logits.detach()] + [p.grad.clone() for p in model.parameters()])
        same = [torch.equal(a, b) for a, b in zip(*runs)]
        print(sum(same), len(same))
        """
    )
    env = {"MKL_CBWR": "AUTO,STRICT", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    same, total = map(int, out.stdout.split())
    assert total > 20 and same == total
