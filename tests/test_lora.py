"""LoRA (`model.lora_configs`): only the adapter trains and syncs, engines serve base + adapter,
checkpoints hold the adapter in peft's format and the merged model, and a resume is exact."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from peft import PeftModel
from test_trainer import experiences
from transformers import AutoConfig, AutoModelForCausalLM

from trinity.config import ConfigError, load_config, resolve
from trinity.config.support import not_built_problems
from trinity.explorer.engine import HFRolloutEngine
from trinity.models import load_model
from trinity.models.lora_merge import weights_of_checkpoint
from trinity.sync.method import state_nbytes, sync_method
from trinity.trainer import lora
from trinity.trainer.trainer import Trainer

RANK, ALPHA = 4, 8  # scaling = 8 / 4 = 2
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(tmp_path, model_dir, lora_yaml: str = "", extra: str = ""):
    p = tmp_path / "cfg.yaml"
    p.write_text(
        f"model: {{model_path: {model_dir}, max_response_tokens: 8,\n"
        f"  lora_configs: [{{lora_rank: {RANK}, lora_alpha: {ALPHA}{lora_yaml}}}]}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 3, kl_loss_fn: k3,\n"
        "  optimizer: {lr: 1.0e-2, weight_decay: 0.0}}\n"
        "trainer: {micro_batch_size_per_gpu: 6, use_dynamic_bsz: false}\n"
        "buffer: {batch_size: 2, explorer_input: {taskset: {storage_type: synthetic, "
        "path: arithmetic}}}\n" + extra
    )
    return load_config(p)


def randomize_adapter(model, seed: int = 1) -> None:
    """Non-zero A and B (a fresh adapter has B = 0, which would make every check trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def token_ids(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(7))


# -- config ----------------------------------------------------------------------------------


def test_lora_configs_are_accepted_with_trinity_rft_s_keys(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir, ", lora_dtype: float32, target_modules: [q_proj]")
    (adapter,) = cfg.model.lora_configs
    assert (adapter.lora_rank, adapter.lora_alpha, adapter.target_modules) == (4, 8, ["q_proj"])


@pytest.mark.parametrize(
    ("lora_yaml", "extra", "path", "says"),
    [
        (
            "}, {lora_rank: 8",
            "",
            "model.lora_configs",
            "one LoRA adapter is trained here",
        ),
        (", target_modules: [q_proj, lm_head]", "", "target_modules", "output head"),
        (", is_dummy: true", "", "is_dummy", "is_dummy"),
        ("", "synchronizer: {sync_method: shared}\n", "sync_method", "only the adapter"),
    ],
)
def test_what_lora_cannot_do_here_is_refused_by_name(
    tmp_path, tiny_model_dir, lora_yaml, extra, path, says
):
    with pytest.raises(ConfigError) as info:
        lora_config(tmp_path, tiny_model_dir, lora_yaml, extra)
    assert path in str(info.value) and says in str(info.value)


def test_starting_from_a_saved_adapter_is_not_built(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir, ", path: /some/adapter")
    (problem,) = not_built_problems(cfg)
    assert problem.path == "model.lora_configs[0].path"
    assert "starting from a saved LoRA adapter" in problem.message


def test_one_process_on_policy_run_with_lora_syncs_by_memory(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir, extra="cluster: {one_process: true}\n")
    r = resolve(cfg)
    assert r.sync_method == "memory" and "lora_configs" in r.sync_method_source


# -- trainer ---------------------------------------------------------------------------------


def test_a_train_step_changes_only_the_adapter_and_the_optimizer_holds_only_it(
    tmp_path, tiny_model_dir
):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    model = trainer.model
    adapters = [p for n, p in model.named_parameters() if is_adapter(n)]
    # A and B of the 7 linear layers of every decoder layer
    assert len(adapters) == 2 * len(LINEARS) * hf.num_hidden_layers
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in adapters}
    assert trainer.ref_model is None and trainer.ref_is_base  # the reference is the base
    before = copy.deepcopy(model.state_dict())
    exps = experiences(hf.vocab_size)
    trainer.train_step(exps)
    trainer.train_step(experiences(hf.vocab_size, seed=1))  # A moves once B is non-zero
    after = model.state_dict()
    for name, t in after.items():
        if is_adapter(name):
            assert not torch.equal(t, before[name]), f"{name} did not train"
        else:
            assert torch.equal(t, before[name]), f"base weight {name} changed"


def test_the_reference_is_the_base_model(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    randomize_adapter(trainer.model)
    base = load_model(tiny_model_dir)
    ids = token_ids(base.config.vocab_size)
    with torch.no_grad():
        adapted = trainer.model(input_ids=ids).logits
        with lora.reference_weights(trainer.model):
            reference = trainer.model(input_ids=ids).logits
        plain = base(input_ids=ids).logits
    assert torch.equal(reference, plain)
    assert (adapted - plain).abs().max() > 1e-3  # the adapter does change the policy
    # the KL term is measured against the base: 0 exactly while B = 0, > 0 once it is not
    fresh = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    assert fresh.train_step(experiences(base.config.vocab_size))["train/kl_loss"] == 0.0
    assert trainer.train_step(experiences(base.config.vocab_size))["train/kl_loss"] > 0.0


# -- sync ------------------------------------------------------------------------------------


def adapter_bytes_by_hand(hf) -> int:
    """fp32 bytes of A [r, in] and B [out, r] of every adapted layer, plus the 4-byte scaling."""
    h, inter = hf.hidden_size, hf.intermediate_size
    head_dim = h // hf.num_attention_heads
    kv = hf.num_key_value_heads * head_dim
    # (in, out) of q, k, v, o, gate, up, down
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    per_layer = sum(RANK * (i + o) for i, o in shapes)  # A: r·in, B: out·r
    return 4 * per_layer * hf.num_hidden_layers + 4


def test_the_synced_state_is_the_adapter_only_and_its_bytes_are_rank_times_shapes(
    tmp_path, tiny_model_dir
):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    state = trainer.sync_state()
    modules = [
        f"model.layers.{i}.{'self_attn' if m[0] in 'qkvo' else 'mlp'}.{m}"
        for i in range(hf.num_hidden_layers)
        for m in LINEARS
    ]
    want = {f"lora.{m}.lora_{x}" for m in modules for x in "AB"} | {"lora.scaling"}
    assert set(state) == want
    assert float(state["lora.scaling"]) == ALPHA / RANK
    # tiny 1m: h = 128, 4 heads of 32, kv 2 heads = 64, intermediate 448, 4 layers, r = 4:
    # per layer 4·(256 + 192 + 192 + 256 + 576 + 576 + 576) = 4·2624 = 10496 floats,
    # 4 layers · 10496 · 4 bytes + 4 (scaling) = 167940 bytes
    assert (hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers) == (128, 448, 4)
    assert adapter_bytes_by_hand(hf) == 167_940 == state_nbytes(state)
    full = sum(
        t.numel() * t.element_size()
        for n, t in load_model(tiny_model_dir).named_parameters()  # a tied tensor once
    )
    assert trainer.full_sync_nbytes == full
    assert state_nbytes(state) < full / 10


def test_lora_dtype_sets_the_adapter_s_dtype_and_halves_its_bytes(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir, ", lora_dtype: bfloat16")
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    dtypes = {(is_adapter(n), p.dtype) for n, p in trainer.model.named_parameters()}
    assert dtypes == {(True, torch.bfloat16), (False, torch.float32)}
    # the fp32 adapter's 167936 bytes of A and B at 2 bytes a number, + the fp32 scaling
    assert state_nbytes(trainer.sync_state()) == 167_936 // 2 + 4
    trainer.train_step(experiences(trainer.model.config.vocab_size))  # peft computes in bf16


@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_an_engine_loading_the_adapter_computes_the_peft_model_s_logits(
    tmp_path, tiny_model_dir, method
):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    randomize_adapter(trainer.model)
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, trim_when_idle=False)
    transport = sync_method(method)
    payload = transport.send(trainer.sync_state(), 1, tmp_path / "sync")
    engine.update_weights(method, payload, 1)
    ids = token_ids(engine.model.config.vocab_size)
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        got = engine.model(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-5
    # the engine's own scoring path (lean head) too
    lp = torch.tensor(engine.logprobs(ids[0].tolist()))
    ref = torch.log_softmax(want[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert (lp - ref).abs().max() < 1e-5


def test_each_adapter_is_merged_into_the_base_not_into_the_last_merge(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    twice = HFRolloutEngine(str(tiny_model_dir), seed=0, trim_when_idle=False)
    randomize_adapter(trainer.model, seed=1)
    twice.load_state({k: v.clone() for k, v in trainer.sync_state().items()}, 1)
    randomize_adapter(trainer.model, seed=2)
    second = {k: v.clone() for k, v in trainer.sync_state().items()}
    twice.load_state(second, 2)
    once = HFRolloutEngine(str(tiny_model_dir), seed=0, trim_when_idle=False)
    once.load_state(second, 2)
    for (name, a), (_, b) in zip(
        twice.model.state_dict().items(), once.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    # the merge W0 + scaling·B·A, by hand for one layer
    w0 = load_model(tiny_model_dir).model.layers[0].self_attn.q_proj.weight
    a = second["lora.model.layers.0.self_attn.q_proj.lora_A"]
    b = second["lora.model.layers.0.self_attn.q_proj.lora_B"]
    merged = once.model.model.layers[0].self_attn.q_proj.weight
    assert torch.allclose(merged, w0 + 2.0 * (b @ a), atol=1e-6)


# -- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_holds_a_peft_adapter_and_the_merged_model(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    randomize_adapter(trainer.model)
    folder = trainer.save_checkpoint(tmp_path / "ckpt", 1)
    adapter = folder / lora.ADAPTER_DIR
    assert (adapter / "adapter_model.safetensors").is_file()
    settings = json.loads((adapter / "adapter_config.json").read_text())
    assert (settings["r"], settings["lora_alpha"]) == (RANK, ALPHA)
    ids = token_ids(trainer.model.config.vocab_size)
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        reloaded = PeftModel.from_pretrained(load_model(tiny_model_dir), str(adapter))
        assert torch.equal(reloaded(input_ids=ids).logits, want)
        merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        assert (merged(input_ids=ids).logits - want).abs().max() < 1e-5
    # what mode bench and the checkpoint sync method read of the folder: the merged model only
    read = sync_method("checkpoint").receive([str(folder)])
    assert set(read) == set(load_model(tiny_model_dir).state_dict()) - {"lm_head.weight"}
    # the export is the model alone: no adapter tensor among its weights
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert not any("lora" in k or "base_layer" in k for k in f.keys())  # noqa: SIM118


def test_engines_continue_from_a_lora_checkpoint_s_adapter_on_their_base(tmp_path, tiny_model_dir):
    """A resumed run's engines (built from the stage's start model) load the checkpoint's
    adapter, and later adapters are merged into that base, not into the checkpoint's merged
    export (which would add the adapter twice)."""
    cfg = lora_config(tmp_path, tiny_model_dir)
    trainer = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    randomize_adapter(trainer.model, seed=1)
    folder = trainer.save_checkpoint(tmp_path / "ckpt", 1)
    assert weights_of_checkpoint(folder) == folder / lora.ADAPTER_DIR
    assert weights_of_checkpoint(tiny_model_dir) == tiny_model_dir  # a full model's folder
    engine = HFRolloutEngine(str(tiny_model_dir), seed=0, trim_when_idle=False)
    engine.update_weights("checkpoint", [str(weights_of_checkpoint(folder))], 1)
    ids = token_ids(engine.model.config.vocab_size)
    for version in (1, 2):
        with torch.no_grad():
            want = trainer.model(input_ids=ids).logits
            assert (engine.model(input_ids=ids).logits - want).abs().max() < 1e-5, version
        randomize_adapter(trainer.model, seed=2)
        engine.load_state({k: v.clone() for k, v in trainer.sync_state().items()}, 2)


def test_resume_restores_adapter_and_optimizer_exactly(tmp_path, tiny_model_dir):
    cfg = lora_config(tmp_path, tiny_model_dir)
    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    first = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    first.train_step(experiences(vocab, seed=0))
    first.train_step(experiences(vocab, seed=1))
    ckpt = first.save_checkpoint(tmp_path / "ckpt", 2)
    first.train_step(experiences(vocab, seed=2))
    resumed = Trainer(cfg, str(tiny_model_dir), total_steps=10)
    resumed.resume(ckpt)
    assert resumed.step == 2
    resumed.train_step(experiences(vocab, seed=2))
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    sa, sb = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert len(sa) == 2 * len(LINEARS) * 4  # A and B of 7 layers × 4: the adapter's state only
    assert sa.keys() == sb.keys()
    for k in sa:
        assert all(torch.equal(sa[k][x], sb[k][x]) for x in ("exp_avg", "exp_avg_sq"))


# -- end to end ------------------------------------------------------------------------------


@pytest.mark.slow  # two trinity runs (15 s, 34 s): make test keeps its 6 minutes
@pytest.mark.parametrize("method", ["default", pytest.param("nccl", marks=pytest.mark.long)])
def test_a_lora_grpo_run_syncs_only_the_adapter(tmp_path, tiny_model_dir, method):
    """`trinity run`, mode both, 3 GRPO steps with a rank-4 adapter: the default layout (one
    process, where an unset sync method is memory with LoRA) and actors with nccl (gloo)."""
    from test_e2e import run_trinity

    cfg, env = lora_grpo_config(tmp_path, tiny_model_dir)
    sets = [f"model.lora_configs=[{{lora_rank: {RANK}, lora_alpha: {ALPHA}}}]"]
    if method == "nccl":
        sets.append("synchronizer.sync_method=nccl")
    r = run_trinity(cfg, env_extra=env, overrides=sets)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {rec["step"]: rec for rec in records}
    hf = AutoConfig.from_pretrained(tiny_model_dir)
    full = sum(t.numel() * t.element_size() for t in load_model(tiny_model_dir).parameters())
    synced = [s for s in (1, 2, 3) if "sync/bytes" in by_step[s]]
    assert synced  # on-policy: the trainer publishes after its steps
    for s in synced:
        assert by_step[s]["sync/bytes"] == adapter_bytes_by_hand(hf)  # 167940: the adapter
        assert by_step[s]["sync/full_bytes"] == full
    for s in (1, 2, 3):  # explore step s sampled with the weights of train step s - 1
        assert by_step[s]["rollout/model_version"] == s - 1
    # the final checkpoint: an adapter that moved, on base weights that did not (its merged
    # export is the start model + the adapter)
    ckpt = run_dir / "global_step_3"
    trained = PeftModel.from_pretrained(load_model(tiny_model_dir), str(ckpt / lora.ADAPTER_DIR))
    b = [p for n, p in trained.named_parameters() if ".lora_B." in n]
    assert max(float(p.abs().max()) for p in b) > 0  # B starts at 0
    ids = token_ids(hf.vocab_size)
    with torch.no_grad():
        want = trained(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        assert (merged(input_ids=ids).logits - want).abs().max() < 1e-5


@pytest.mark.long  # a crash trial: an interrupted and an uninterrupted `trinity run` (~45 s)
def test_a_resumed_lora_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path, tiny_model_dir):
    """SFT with an adapter: 6 steps at once, or 4 steps then a resume to 6 (a new process
    that loads the adapter and its optimizer state from the step-4 checkpoint)."""
    from safetensors.torch import load_file
    from test_e2e import run_trinity
    from test_resume import sft_config

    sets = [f"model.lora_configs=[{{lora_rank: {RANK}, lora_alpha: {ALPHA}}}]"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):
        d.mkdir()
    for cfg, more in [
        (sft_config(whole, tiny_model_dir, 6), []),
        (sft_config(cut, tiny_model_dir, 4), []),
        (sft_config(cut, tiny_model_dir, 6), ["continue_from_checkpoint=true"]),
    ]:
        r = run_trinity(cfg, overrides=sets + more)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resuming stage main from" in r.stdout
    a, b = (d / "ckpt" / "e2e" / "sft" / "global_step_6" for d in (whole, cut))
    for name in (f"{lora.ADAPTER_DIR}/adapter_model.safetensors", "model.safetensors"):
        wa, wb = load_file(a / name), load_file(b / name)
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), (name, k)
    adapter = f"{lora.ADAPTER_DIR}/adapter_model.safetensors"
    early, late = load_file(a.parent / "global_step_2" / adapter), load_file(a / adapter)
    assert any(not torch.equal(early[k], late[k]) for k in late)  # it trained from 2 to 6


def lora_grpo_config(tmp_path, model_dir):
    """`test_e2e.grpo_config` with a reward that varies on an untrained model (the parity of
    the response's length), so GRPO's groups give the adapter a gradient; its PYTHONPATH."""
    from test_e2e import ROOT, grpo_config, user_module

    user_module(
        tmp_path,
        "userpkg",
        "rw",
        "def parity(response, truth, task_raw):\n"
        "    return {'accuracy': float(len(response) % 2)}\n",
    )
    cfg = grpo_config(tmp_path, model_dir)
    cfg.write_text(cfg.read_text().replace("arithmetic_reward", "userpkg.rw.parity"))
    return cfg, {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}


@pytest.mark.long  # two `trinity run`s (~60 s)
def test_a_resumed_lora_grpo_run_samples_with_the_trainer_s_weights(tmp_path, tiny_model_dir):
    """2 steps, then a resume to 4: the engines, built from the base, continue from the
    checkpoint's adapter, and every step's rollouts come from the weights the trainer trains
    (the engine's logprobs of the sampled tokens equal the trainer's π_old). Engines that took
    the checkpoint's merged export as their base would add every later adapter twice."""
    from test_e2e import run_trinity

    cfg, env = lora_grpo_config(tmp_path, tiny_model_dir)
    sets = [f"model.lora_configs=[{{lora_rank: {RANK}, lora_alpha: {ALPHA}}}]"]
    sets += ["explorer.eval_interval=0", "trainer.save_interval=2"]
    for more in (
        ["buffer.total_steps=2"],
        ["buffer.total_steps=4", "continue_from_checkpoint=true"],
    ):
        r = run_trinity(cfg, env_extra=env, overrides=sets + more)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resuming stage main from" in r.stdout
    run_dir = tmp_path / "ckpt" / "e2e" / "grpo"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diff = {
        r["step"]: r["off_policy/abs_logprob_diff"]
        for r in records
        if "off_policy/abs_logprob_diff" in r
    }
    assert sorted(diff) == [1, 2, 3, 4]
    assert max(diff.values()) < 1e-4, diff  # fp32 rounding only
    late = load_model(tiny_model_dir)  # the adapter did move away from B = 0
    trained = PeftModel.from_pretrained(late, str(run_dir / "global_step_4" / lora.ADAPTER_DIR))
    assert max(float(p.abs().max()) for n, p in trained.named_parameters() if ".lora_B." in n) > 0
