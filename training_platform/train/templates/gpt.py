"""A small GPT-style causal language model (pre-norm transformer blocks, learned positions).

Trained on the ``python_stdlib_text`` snapshot: ``num_classes`` is the snapshot tokenizer's
vocabulary and each row holds ``num_features`` tokens, of which the first ``seq_len + 1`` are
used (inputs and the targets shifted by one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training_platform.spec import TrainSpec

TASK = "causal_lm"
# (layers, heads, width) per size
SIZES = {"tiny": (2, 2, 64), "small": (4, 4, 128), "base": (6, 6, 384)}


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, layers: int, heads: int, width: int):
        super().__init__()
        self.seq_len = seq_len
        self.layers, self.width = layers, width
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.apply(_init)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def dimensions(spec: TrainSpec) -> tuple[int, int, int]:
    """(layers, heads, width): the size's defaults, overridden by model.layers/heads/width."""
    layers, heads, width = SIZES[spec.model.size]
    return spec.model.layers or layers, spec.model.heads or heads, spec.model.width or width


def build_model(spec: TrainSpec, num_features: int, num_classes: int) -> nn.Module:
    if spec.model.seq_len + 1 > num_features:
        raise ValueError(
            f"model.seq_len {spec.model.seq_len} needs rows of {spec.model.seq_len + 1} tokens, the snapshot has "
            f"{num_features}; set model.seq_len <= {num_features - 1}"
        )
    layers, heads, width = dimensions(spec)
    if width % heads:
        raise ValueError(f"model width {width} is not a multiple of heads {heads}; set model.width or model.heads")
    return GPT(num_classes, spec.model.seq_len, layers, heads, width)


def split_batch(rows: torch.Tensor, spec: TrainSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) from token rows: targets are the inputs shifted by one."""
    tokens = rows[:, : spec.model.seq_len + 1]
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_sample(model: nn.Module, spec: TrainSpec) -> float:
    """Training FLOPs per sequence: 6 per parameter per token plus attention (the PaLM appendix formula)."""
    params = sum(p.numel() for p in model.parameters())
    layers, _, width = dimensions(spec)
    tokens = spec.model.seq_len
    return tokens * (6.0 * params + 12.0 * layers * width * tokens)


def tokens_per_sample(spec: TrainSpec) -> int:
    return spec.model.seq_len


@torch.no_grad()
def evaluate_split(model: nn.Module, snapshot_root, manifest, split: str, spec: TrainSpec) -> dict[str, float]:
    """Loss, perplexity and next-token accuracy over a whole split (for the evaluation asset)."""
    import numpy as np

    from training_platform.datasets.reader import read_split_table

    table = read_split_table(snapshot_root, manifest, split)
    columns = manifest.feature_columns[: spec.model.seq_len + 1]
    rows = torch.from_numpy(np.stack([table.column(c).to_numpy().astype(np.int64) for c in columns], axis=1))
    model.eval()
    losses, correct, count = [], 0, 0
    for batch in rows.split(256):
        inputs, targets = split_batch(batch, spec)
        logits = model(inputs)
        losses.append(loss_fn(logits, targets).item() * targets.numel())
        correct += int((logits.argmax(dim=-1) == targets).sum())
        count += targets.numel()
    loss = sum(losses) / count
    return {"loss": loss, "perplexity": float(torch.tensor(loss).exp()), "accuracy": correct / count}
