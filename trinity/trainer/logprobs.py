"""Per-token logprobs (and entropy) of response tokens without materialising full logits.

A naive step on a 49k-vocabulary model holds B×T×V fp32 logits (0.8 GB for 32×128). Here the
backbone's hidden states are gathered at the response positions only and the LM head runs on
`chunk_size` tokens at a time.
"""

from __future__ import annotations

import torch

from trinity.algorithm.entropy import entropy_from_logits
from trinity.trainer.batch import Batch


def response_logprobs(
    model: torch.nn.Module, batch: Batch, chunk_size: int = 1024, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (logprobs [B, R], entropy [B, R] or None); zeros where `valid_mask` is False."""
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    head = model.get_output_embeddings()
    hidden = backbone(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state  # [B, T, H]
    rows, cols = torch.nonzero(batch.valid_mask, as_tuple=True)  # N valid response tokens
    if rows.numel() == 0:
        raise ValueError("train batch has no response tokens: every experience is prompt-only")
    h = hidden[rows, batch.response_pos[rows, cols]]  # [N, H]
    labels = batch.response_ids[rows, cols]  # [N]
    lp_parts, ent_parts = [], []
    for s in range(0, h.shape[0], chunk_size):
        logits = head(h[s : s + chunk_size]).float()  # [n, V]
        logp = torch.log_softmax(logits, dim=-1)
        lp_parts.append(logp.gather(-1, labels[s : s + chunk_size, None]).squeeze(-1))
        if with_entropy:
            ent_parts.append(entropy_from_logits(logits))
    logprobs = torch.zeros(batch.valid_mask.shape, dtype=torch.float32, device=h.device)
    logprobs = logprobs.index_put((rows, cols), torch.cat(lp_parts))
    entropy = None
    if with_entropy:
        entropy = torch.zeros_like(logprobs).index_put((rows, cols), torch.cat(ent_parts))
    return logprobs, entropy
