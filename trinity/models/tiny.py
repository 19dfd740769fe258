"""Tiny random-init Qwen2 models with a locally trained tokenizer: offline, deterministic.

    trinity model create --out /tmp/tiny --preset 1m --seed 0
    model.model_path: tiny://1m?seed=0            # built once into the cache on first use

The tokenizer is a byte-level BPE trained with `tokenizers` on a fixed corpus (the synthetic
arithmetic and countdown tasks, short word problems and chat words), digits split one per token,
with Qwen's ChatML template and special tokens. It does not depend on the seed; the weights do.
The same (preset, seed) gives byte-identical `model.safetensors` and `tokenizer.json` on every
build. The result is an ordinary Hugging Face folder that `AutoModelForCausalLM` and
`AutoTokenizer` load unchanged; a marker file `trinity_tiny.json` records how it was built,
including `builder_fingerprint()`, so a build by a changed builder is never taken for current.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from trinity.models.folders import build_folder

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2
TOKENIZER_VOCAB_TARGET = 1024
MARKER = "trinity_tiny.json"
# Qwen2's pre-tokenizer split (transformers' models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _shape(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int
) -> dict[str, int]:
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
    )


# Qwen2 shapes (hidden, intermediate, layers, heads, kv heads); tied embeddings, vocab 832 (806
# tokens padded to a multiple of 64). Parameter counts as measured by `count_parameters`.
PRESETS: dict[str, dict[str, int]] = {
    "1m": _shape(128, 448, 4, 4, 2),  # 993,408 params
    "5m": _shape(256, 768, 6, 4, 2),  # 4,937,984 params
    "10m": _shape(320, 1024, 8, 5, 1),  # 10,105,664 params
    "20m": _shape(384, 1280, 11, 6, 2),  # 20,880,896 params
    "50m": _shape(512, 1536, 16, 8, 2),  # 48,689,664 params
}
MAX_POSITION_EMBEDDINGS = 2048

# -- tokenizer ---------------------------------------------------------------------------------

# fmt: off
_NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Jack", "Emma", "Noah", "Olivia", "Liam",
          "Ava", "Lucas", "Sophia", "James", "Grace"]
_ITEMS = ["apples", "oranges", "books", "pencils", "cookies", "marbles", "stickers", "candies",
          "cards", "coins", "shells", "eggs", "flowers", "cupcakes", "toys", "balloons", "bottles",
          "boxes", "tickets", "dollars", "minutes", "hours", "pages", "miles"]
# fmt: on
_TEMPLATES = [
    "{n} has {a} {i}. {m} gives {n} {b} more {i}. How many {i} does {n} have now?",
    "{n} had {a} {i} and lost {b} of them. How many {i} are left?",
    "There are {a} bags with {b} {i} in each bag. How many {i} are there in total?",
    "{n} wants to share {a} {i} equally among {b} friends. How many {i} does each friend get?",
    "{n} buys {a} {i} for {b} dollars each. How much money does {n} spend?",
    "If {n} reads {a} pages every day, how many pages will {n} read in {b} days?",
    "{n} and {m} collected {a} and {b} {i}. What is the total number of {i} they have?",
    "A store sold {a} {i} on Monday and {b} {i} on Tuesday. How many more were sold on Monday?",
    "Each week {n} saves {a} dollars. After {b} weeks, how much money has {n} saved?",
    "The price of {a} {i} is {b} dollars. What is the price of one?",
]
_SOLUTIONS = [
    "Let's think step by step. First, we add the numbers: {a} + {b} = {s}. The answer is {s}.",
    "We need to find the total. {a} + {b} = {s}, so the final answer is \\boxed{{{s}}}.",
    "So {n} has {s} {i} in all. Therefore the answer is {s}.\n#### {s}",
    "To solve this problem, multiply {a} by {b}. This gives {p}. The result is {p}.",
    "<think> I should subtract {b} from {a}, which is {d}. </think> <answer> {d} </answer>",
]
_CHAT = [
    "You are a helpful assistant.",
    "You are a helpful assistant. Solve the math problem and put the final answer at the end.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Answer with a number only. Use each number at most once. Show your work.",
    "Using the numbers, create an equation that equals the target. You can use + - * / and ( ).",
    "system user assistant tool function call result question answer response correct wrong",
    "Okay, let me check. Yes, that is right. No, try again. Hello! Thanks. Sure, here it is:",
    "\\frac{1}{2} \\sqrt{2} \\times \\div \\cdot \\left( \\right) \\pi x^2 y_1 $x$ = < > % .",
]


def tokenizer_corpus() -> list[str]:
    """The fixed training text of the tokenizer (deterministic: no seed involved).

    Task-shaped lines (arithmetic with 1-3 digits, countdown puzzles) are frozen data,
    `tokenizer_tasks.json`: drawn once from the synthetic generators (seed 0), kept as text so
    the tokenizer depends on no task code and a generator's change never changes it."""
    import random

    lines: list[str] = json.loads((Path(__file__).parent / "tokenizer_tasks.json").read_text())
    rng = random.Random(0)
    for k in range(600):
        n, m = rng.sample(_NAMES, 2)
        a, b = rng.randint(2, 99), rng.randint(2, 20)
        fields = dict(n=n, m=m, i=rng.choice(_ITEMS), a=a, b=b, s=a + b, p=a * b, d=a - b)
        lines.append(_TEMPLATES[k % len(_TEMPLATES)].format(**fields))
        lines.append(_SOLUTIONS[k % len(_SOLUTIONS)].format(**fields))
    lines += [
        f"{IM_START}{role}\n{text}{IM_END}\n" for role in ("system", "user") for text in _CHAT
    ]
    return lines * 2  # every word at least twice: min_frequency=2 keeps it


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """Train the byte-level BPE once per process; returns its JSON serialization."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Qwen2's pipeline exactly: `AutoTokenizer` loads any qwen2-typed folder as `Qwen2Tokenizer`,
    # which rebuilds normalizer and pre-tokenizer this way (Qwen's regex already isolates each
    # digit; `Digits` says so explicitly for readers of tokenizer.json).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_TARGET,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    return tok.to_str()


def build_tokenizer() -> Any:
    """The tiny models' tokenizer as a `PreTrainedTokenizerFast` with the ChatML template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


@lru_cache(maxsize=1)
def model_vocab_size() -> int:
    """The embedding rows: the tokenizer's size rounded up to a multiple of 64."""
    from tokenizers import Tokenizer

    n = Tokenizer.from_str(_tokenizer_json()).get_vocab_size(with_added_tokens=True)
    return (n + 63) // 64 * 64


@lru_cache(maxsize=1)
def builder_fingerprint() -> str:
    """12 hex digits that change whenever a build could produce different bytes.

    Hashes everything a build reads: the tokenizer corpus and its training settings, the chat
    template, the presets, and the versions of torch (weight init), transformers (config and
    weight files) and tokenizers (BPE training). The `tiny://` cache keys its folders by it, so a
    changed builder never reuses a stale model.
    """
    import tokenizers
    import torch
    import transformers

    parts = {
        "corpus": tokenizer_corpus(),
        "special_tokens": SPECIAL_TOKENS,
        "vocab_target": TOKENIZER_VOCAB_TARGET,
        "pretokenize": QWEN2_PRETOKENIZE_REGEX,
        "chat_template": CHAT_TEMPLATE,
        "presets": PRESETS,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "versions": [torch.__version__, transformers.__version__, tokenizers.__version__],
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


# -- model -------------------------------------------------------------------------------------


def preset_config(preset: str) -> Any:
    """The `Qwen2Config` of a preset (the tokenizer's special-token ids filled in)."""
    from transformers import Qwen2Config

    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; valid: {', '.join(PRESETS)}")
    return Qwen2Config(
        vocab_size=model_vocab_size(),
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index(IM_END),
        pad_token_id=SPECIAL_TOKENS.index(ENDOFTEXT),
        **PRESETS[preset],
    )


def count_parameters(preset: str) -> int:
    """Parameters of a preset (tied embeddings counted once), measured on the meta device."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(preset_config(preset))
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """No "Writing model shards" progress bar for a 4 MB file."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _build(out: Path, preset: str, seed: int) -> None:
    """Write model + tokenizer + marker into the (empty, private) folder `out`."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    config = preset_config(preset)
    im_end, endoftext = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, endoftext], pad_token_id=endoftext, bos_token_id=None
    )
    with _quiet_progress():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker = {
        "preset": preset,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "fingerprint": builder_fingerprint(),
    }
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def is_tiny_model_dir(path: Path, preset: str, seed: int) -> bool:
    """True when `path` holds a finished build of (preset, seed) by the current builder."""
    try:
        marker = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("preset") == preset
        and marker.get("seed") == seed
        and marker.get("fingerprint") == builder_fingerprint()
    )


def create_tiny_model(
    out_dir: str | Path, preset: str = "1m", seed: int = 0, overwrite: bool = False
) -> Path:
    """Build a tiny Qwen2 model and its tokenizer into `out_dir`; returns the folder.

    1. an existing finished build of the same (preset, seed) is returned as is; anything else
       but an empty folder raises FileExistsError unless `overwrite`
    2. build in a private temp folder beside `out_dir`
    3. rename it into place (atomic), so readers never see a half-written folder; a build that
       lost a race to an identical one is discarded
    """
    out = Path(out_dir).expanduser().absolute()
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; valid: {', '.join(PRESETS)}")
    return build_folder(
        out,
        lambda tmp: _build(tmp, preset, seed),
        lambda folder: is_tiny_model_dir(folder, preset, seed),
        overwrite,
    )
