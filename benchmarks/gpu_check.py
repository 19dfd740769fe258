"""What only a GPU can show, in one Ray-free script of at most 10 minutes.

    python benchmarks/gpu_check.py                 # on a CUDA machine (bf16, Qwen2.5-0.5B shape)
    python benchmarks/gpu_check.py --smoke         # the same code paths on CPU, tiny shapes

Checks, each printed as it finishes and all written to benchmarks/results/gpu_check.json:
1. FSDP2 world 1 in bf16 (`trainer_strategy: fsdp2` code, one rank, NCCL) on a randomly
   initialised Qwen2.5-0.5B-shaped model (24 layers, hidden 896, vocabulary 151,936): train
   tokens/s and MFU of a GRPO step at sequence lengths 1,024 and 2,048 (target: MFU >= 5%, what
   small-model RL trainers reach). MFU = model FLOPs per second / the GPU's dense bf16 peak, with
   the model FLOPs of a train step 6 N tokens + 12 L H S tokens (N the non-embedding parameters
   plus the LM head, L layers, H hidden, S the sequence length: the attention term of Megatron's
   formula); recomputation is not counted.
2. Our rollout engine's decode tokens/s against Hugging Face `generate` on the same weights
   (32 prompts of 128 tokens, 256 new tokens, sampling at temperature 1).
3. DCP on CUDA: a checkpoint of the sharded trainer resumed into a fresh one gives bit-identical
   weights and the same next step.
4. A LoRA step, when `peft` is installed (the `lora` extra): only adapter weights change.
5. Colocation: the device memory our engine's sleep and the trainer's move to host memory give
   back, and the same logprobs after the engine wakes.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

# dense bf16 peak FLOP/s by device name (tensor cores, no sparsity)
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}
QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936}  # fmt: skip
SMOKE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 4096}  # fmt: skip


def build_model(folder: Path, shape: dict, dtype: torch.dtype) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trinity.models.tiny import build_tokenizer

    config = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def trainer_config(tmp: Path, model: Path, dtype: str, max_tokens: int, lora: bool = False):
    from trinity.config import load_config

    lora_key = ", lora_configs: [{lora_rank: 8, lora_alpha: 16}]" if lora else ""
    p = tmp / "cfg.yaml"
    p.write_text(
        f"model: {{model_path: {model}, max_response_tokens: 4096{lora_key}}}\n"
        "algorithm: {algorithm_type: grpo, repeat_times: 4, kl_loss_fn: none, "
        "optimizer: {lr: 1.0e-6}}\n"
        f"trainer: {{dtype: {dtype}, use_dynamic_bsz: true, max_token_len_per_gpu: {max_tokens}}}\n"
        "buffer: {batch_size: 1, explorer_input: {taskset: {path: t}}}\n"
    )
    return load_config(p)


def experiences(vocab: int, rows: int, seq: int):
    from trinity.common.experience import EID, Experience

    g = torch.Generator().manual_seed(0)
    prompt = seq // 8
    return [
        Experience(
            tokens=torch.randint(3, vocab, (seq,), generator=g),
            prompt_length=prompt,
            logprobs=-torch.rand(seq - prompt, generator=g),
            reward=float(i % 2),
            eid=EID(batch=1, task=i // 4, run=i % 4),
        )
        for i in range(rows)
    ]


def model_flops_per_token(shape: dict, seq: int) -> float:
    h, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter  # q, o, k, v, gate/up/down
    params = layers * per_layer + h * shape["vocab_size"]  # + the LM head
    return 6 * params + 12 * layers * h * seq


def sharded_trainer(cfg, model: Path, port: int):
    from trinity.trainer.parallel import Ranks
    from trinity.trainer.sharding import init_process_group
    from trinity.trainer.trainer import Trainer

    ranks = Ranks(0, 1)
    if not torch.distributed.is_initialized():
        init_process_group(ranks, ("127.0.0.1", port))
    return Trainer(cfg, str(model), total_steps=100, ranks=ranks)


def check_train(args, tmp: Path, model: Path, shape: dict, out: dict) -> None:
    peak = next((v for k, v in PEAK_BF16.items() if k in out["device"]), None)
    for seq, rows in args.train_shapes:
        cfg = trainer_config(tmp, model, args.dtype, max_tokens=seq * args.rows_per_micro)
        trainer = sharded_trainer(cfg, model, args.port)
        exps = experiences(shape["vocab_size"], rows, seq)
        trainer.train_step(copy.deepcopy(exps))  # warm-up
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step(copy.deepcopy(exps))
        sync()
        dt = (time.perf_counter() - t0) / args.steps
        tokens = rows * seq
        flops = model_flops_per_token(shape, seq) * tokens / dt
        row = {"seq": seq, "rows": rows, "step_s": dt, "tokens_per_s": tokens / dt,
               "tflops": flops / 1e12, "mfu": flops / peak if peak else None}  # fmt: skip
        out["train"].append(row)
        mfu = f"{row['mfu']:.1%}" if peak else "n/a (unknown peak)"
        print(
            f"train seq {seq}: {tokens / dt:,.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s, MFU {mfu}"
        )
        del trainer
        cleanup()


def check_decode(args, model: Path, out: dict) -> None:
    from transformers import AutoModelForCausalLM

    from trinity.common.rollout import SamplingParams
    from trinity.explorer.engine import HFRolloutEngine

    device = out["device_type"]
    engine = HFRolloutEngine(str(model), dtype=args.dtype, seed=0, max_batch_size=64)
    g = torch.Generator().manual_seed(1)
    vocab = engine.model.config.vocab_size
    prompts = [torch.randint(3, vocab, (128,), generator=g).tolist() for _ in range(32)]
    params = SamplingParams(n=1, temperature=1.0, max_tokens=args.new_tokens)
    engine.generate(prompts[:2], params)  # warm-up
    sync()
    t0 = time.perf_counter()
    res = engine.generate(prompts, params)
    sync()
    ours = sum(len(s.response_ids) for r in res for s in r) / (time.perf_counter() - t0)
    del engine
    cleanup()
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype_of(args.dtype)).to(device)
    ids = torch.tensor(prompts, device=device)
    kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "max_new_tokens": args.new_tokens,
          "min_new_tokens": args.new_tokens, "pad_token_id": 0}  # fmt: skip
    hf.generate(ids[:2], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
    sync()
    t0 = time.perf_counter()
    gen = hf.generate(ids, **kw)
    sync()
    theirs = (gen.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - t0)
    out["decode"] = {"ours_tokens_per_s": ours, "hf_generate_tokens_per_s": theirs,
                     "ratio": ours / theirs}  # fmt: skip
    print(f"decode: ours {ours:,.0f} tokens/s, HF generate {theirs:,.0f} ({ours / theirs:.2f}x)")
    del hf
    cleanup()


def check_dcp(args, tmp: Path, model: Path, shape: dict, out: dict) -> None:
    cfg = trainer_config(tmp, model, args.dtype, max_tokens=1024)
    exps = experiences(shape["vocab_size"], 4, 256)
    a = sharded_trainer(cfg, model, args.port)
    a.train_step(copy.deepcopy(exps))
    ckpt = a.save_checkpoint(tmp / "ckpt", 1)
    expected = a.train_step(copy.deepcopy(exps))["train/loss"]
    weights_a = a.sync_state()
    del a
    b = sharded_trainer(cfg, model, args.port)
    b.resume(ckpt)
    got = b.train_step(copy.deepcopy(exps))["train/loss"]
    same = all(torch.equal(weights_a[k], v) for k, v in b.sync_state().items())
    out["dcp"] = {"same_next_loss": got == expected, "same_weights_after": same}
    print(f"DCP on {out['device_type']}: same next loss {got == expected}, same weights {same}")
    del b
    cleanup()


def check_lora(args, tmp: Path, model: Path, shape: dict, out: dict) -> None:
    try:
        import peft  # noqa: F401
    except ImportError as e:  # the lora extra is not installed
        out["lora"] = {"skipped": str(e)}
        print(f"LoRA: skipped ({e}; pip install -e '.[lora]')")
        return
    cfg = trainer_config(tmp, model, args.dtype, max_tokens=1024, lora=True)
    from trinity.trainer.trainer import Trainer

    trainer = Trainer(cfg, str(model), total_steps=10)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(experiences(shape["vocab_size"], 4, 256))
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    only_adapters = bool(changed) and all("lora_" in n for n in changed)
    out["lora"] = {"changed": len(changed), "only_adapters": only_adapters}
    print(f"LoRA: {len(changed)} tensors changed, all adapters: {only_adapters}")


def check_colocation(args, tmp: Path, model: Path, shape: dict, out: dict) -> None:
    """Colocation (`common.turns`): what the engine's sleep and the trainer's move to host
    memory give back to the device, and that waking changes no logprob."""
    from trinity.explorer.engine import HFRolloutEngine
    from trinity.trainer.trainer import Trainer

    def allocated() -> int:
        return torch.cuda.memory_allocated() if out["device_type"] == "cuda" else 0

    engine = HFRolloutEngine(str(model), dtype=args.dtype, seed=0)
    tokens = list(range(3, 67))
    before, held = engine.logprobs(tokens), allocated()
    moved = engine.sleep(1)
    asleep = allocated()
    engine.wake_up()
    same = engine.logprobs(tokens) == before
    del engine
    cleanup()
    cfg = trainer_config(tmp, model, args.dtype, max_tokens=1024)
    trainer = Trainer(cfg, str(model), total_steps=10)
    trainer.train_step(experiences(shape["vocab_size"], 4, 256))
    on = allocated()
    trainer_moved = trainer.place(False)
    off = allocated()
    trainer.place(True)
    out["colocation"] = {
        "engine_moved_bytes": moved, "engine_freed_bytes": held - asleep,
        "same_logprobs_after_wake": same, "trainer_moved_bytes": trainer_moved,
        "trainer_freed_bytes": on - off,
    }  # fmt: skip
    print(
        f"colocation: engine asleep frees {(held - asleep) / 2**20:,.0f} MiB (moved "
        f"{moved / 2**20:,.0f}), same logprobs after waking {same}; trainer in host memory "
        f"frees {(on - off) / 2**20:,.0f} MiB (moved {trainer_moved / 2**20:,.0f})"
    )
    del trainer
    cleanup()


def dtype_of(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cleanup() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (fp32)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gpu_check.json"))
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        sys.exit("no CUDA device: run with --smoke for the CPU code paths")
    shape = SMOKE if args.smoke else QWEN_05B
    args.dtype = "float32" if args.smoke else "bfloat16"
    args.train_shapes = [(64, 4), (128, 4)] if args.smoke else [(1024, 16), (2048, 8)]
    args.rows_per_micro = 4
    args.new_tokens = 8 if args.smoke else 256
    out = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_type": "cuda" if cuda else "cpu",
        "torch": torch.__version__,
        "shape": shape,
        "train": [],
    }
    print(f"device: {out['device']}, torch {torch.__version__}, dtype {args.dtype}")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = build_model(tmp / "model", shape, dtype_of(args.dtype))
        for check in (check_train, check_dcp, check_lora, check_colocation):
            check(args, tmp, model, shape, out)
        check_decode(args, model, out)
    out["wall_s"] = time.perf_counter() - t_start
    print(f"wall {out['wall_s']:.0f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    ok = all(r["mfu"] is None or r["mfu"] >= 0.05 for r in out["train"])
    print("MFU target (>= 5%):", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
