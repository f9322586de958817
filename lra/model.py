"""A small ListOps classifier around any sequence mixer of :data:`attention.MIXERS`.

Token embedding + learned position embedding, ``depth`` pre-norm :class:`attention.MixerBlock` s with the chosen mixer,
a final LayerNorm, mean pooling over the real tokens, a linear head. Padding tokens (id 0) are mixed like any token
(matrix mixers here take no mask); the pooling and the labels ignore them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention import MixerBlock, build_mixer
from engine.registry import ModelRegistry

from .data import VOCAB

__all__ = ["MODELS", "ListOpsClassifier", "create_model", "list_models", "listops_classifier", "register_model"]


class ListOpsClassifier(nn.Module):
    """Embedding + position embedding -> ``depth`` MixerBlocks -> LayerNorm -> masked mean pool -> linear.

    Shapes:
        tokens: ``(B, L)`` ids, 0 = padding, L <= seq_len; output: ``(B, num_classes)``.
    """

    def __init__(
        self,
        mixer: str = "softmax",
        seq_len: int = 2000,
        width: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        drop: float = 0.0,
        num_classes: int = 10,
        mixer_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), width, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, seq_len, width) * 0.02)
        self.blocks = nn.ModuleList(
            [
                MixerBlock(
                    width,
                    build_mixer(mixer, width, num_heads=num_heads, max_len=seq_len, **(mixer_kwargs or {})),
                    mlp_ratio=mlp_ratio,
                    drop=drop,
                )
                for _ in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        B, L = tokens.shape
        x = self.embed(tokens) + self.pos[:, :L]  # (B, L, C)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        keep = (tokens != 0).unsqueeze(-1).to(x.dtype)  # (B, L, 1)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp_min(1))


def _example_inputs(model: nn.Module, config: dict) -> tuple[Tensor]:
    """Two sequences of token ids over the model's ``seq_len``: every token, and half of them then padding."""
    L = model.pos.shape[1]
    tokens = torch.randint(1, len(VOCAB), (2, L), generator=torch.Generator().manual_seed(0))
    tokens[1, (L + 1) // 2 :] = 0
    return (tokens,)


MODELS, register_model, list_models, create_model = ModelRegistry("sequence", example_inputs=_example_inputs).exports()


@register_model
def listops_classifier(**kwargs) -> ListOpsClassifier:
    """:class:`ListOpsClassifier` (``mixer=`` any name of :data:`attention.MIXERS`)."""
    return ListOpsClassifier(**kwargs)
