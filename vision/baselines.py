"""The paper's efficient-attention baselines on the DeiT skeleton: Set Transformer (ISAB) and Linformer mixers.

Wu et al., arXiv:2102.08606, section 3.4 compares its centroid DeiTs with DeiTs whose every self-attention is replaced
by an efficient mixer. Both use :class:`vision.centroid_deit.CentroidViT` with no centroid block (same stem, class
token, position embedding, pre-norm blocks, head); only the mixer of every block changes.

* **Set Transformer** (Lee et al., "Set Transformer", ICML 2019, arXiv:1810.00825): the induced set attention block
  ``ISAB(X) = MAB(X, H)``, ``H = MAB(I, X)`` with m learned inducing points I per block. Pre-norm, timm style:
  ``H = I + Attn(I -> LN(X))``, ``out = Attn(LN(X) -> LN_h(H))``. The two attention steps share one ``qkv`` / ``proj``
  (timm's ``Attention`` layout, so a DeiT checkpoint loads); cost O(N m C) instead of O(N^2 C).
* **Linformer** (Wang et al., "Linformer", arXiv:2006.04768): keys and values projected along the sequence,
  ``K' = E K``, ``V' = F V`` with learned ``E, F: (k, L)`` shared by the heads of a block (L = 1 + N tokens).

The paper's text lost m and k. Defaults chosen to reproduce its parameter counts: ``num_inducing=64`` (+12 x 64 x C
params: 5.86 / 22.35 M vs the paper's 5.9 / 22.4 M) and ``proj_len=128`` (+12 x 2 x 197 x 128: 6.32 / 22.66 M vs
6.3 / 22.6 M). Both are model kwargs (``timm.create_model(name, num_inducing=32)``).
"""

from __future__ import annotations

import logging
import re

import torch
import torch.nn.functional as F
from timm.layers import Attention, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import Tensor, nn

from .centroid_deit import _SMALL, _TINY, CentroidViT, _cfg, _create_centroid_deit
from .centroid_deit import checkpoint_filter_fn as _deit_filter

__all__ = ["InducedSetAttention", "LinformerAttention", "LinformerViT", "SetTransformerViT", "checkpoint_filter_fn"]

_logger = logging.getLogger(__name__)


def _heads(x: Tensor, H: int) -> Tensor:
    B, L, C = x.shape
    return x.reshape(B, L, H, C // H).transpose(1, 2)  # (B, H, L, D)


class InducedSetAttention(Attention):
    """ISAB mixer with m learned inducing points; the two steps share ``qkv`` and ``proj``.

    Shapes:
        x: ``(B, L, C)`` (already normed by the block); output: ``(B, L, C)``.
    """

    def __init__(self, dim: int, num_heads: int = 8, num_inducing: int = 64, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.inducing = nn.Parameter(trunc_normal_(torch.zeros(1, num_inducing, dim), std=0.02))
        self.norm_h = nn.LayerNorm(dim, eps=1e-6)

    def _attend(self, q_in: Tensor, kv_in: Tensor) -> Tensor:
        C = q_in.shape[-1]
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(q_in, w[:C], None if b is None else b[:C])  # (B, M, C)
        k, v = F.linear(kv_in, w[C:], None if b is None else b[C:]).chunk(2, dim=-1)  # (B, L, C) each
        H = self.num_heads
        p = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(_heads(q, H), _heads(k, H), _heads(v, H), dropout_p=p)  # (B, H, M, D)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(q_in.shape[0], -1, C)))

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        B, L, C = x.shape
        inducing = self.inducing.expand(B, -1, -1)  # (B, m, C)
        h = inducing + self._attend(inducing, x)  # H = MAB(I, X)
        return self._attend(x, self.norm_h(h))  # MAB(X, H), the block adds the residual


class LinformerAttention(Attention):
    """Linformer mixer: keys and values projected from L tokens to k along the sequence (shared by the heads).

    Shapes:
        x: ``(B, L, C)`` with L = ``seq_len``; output: ``(B, L, C)``.
    """

    def __init__(self, dim: int, num_heads: int = 8, seq_len: int = 197, proj_len: int = 128, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.seq_len = seq_len
        self.proj_k = nn.Linear(seq_len, proj_len, bias=False)  # E
        self.proj_v = nn.Linear(seq_len, proj_len, bias=False)  # F

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        B, L, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, L, C) each
        k = self.proj_k(k.transpose(1, 2)).transpose(1, 2)  # (B, k, C)
        v = self.proj_v(v.transpose(1, 2)).transpose(1, 2)  # (B, k, C)
        H = self.num_heads
        p = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(_heads(q, H), _heads(k, H), _heads(v, H), dropout_p=p)  # (B, H, L, D)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, L, C)))


class SetTransformerViT(CentroidViT):
    """DeiT whose every block mixes tokens with :class:`InducedSetAttention` (no centroid block)."""

    def __init__(self, num_inducing: int = 64, **kwargs) -> None:
        self.num_inducing = num_inducing
        kwargs["centroid_index"] = None
        super().__init__(**kwargs)

    def _make_mixer(self, index: int, grid: tuple[int, int]) -> nn.Module:
        return InducedSetAttention(self.embed_dim, self._num_heads, self.num_inducing, qkv_bias=self._qkv_bias)


class LinformerViT(CentroidViT):
    """DeiT whose every block mixes tokens with :class:`LinformerAttention` (no centroid block)."""

    def __init__(self, proj_len: int = 128, **kwargs) -> None:
        self.proj_len = proj_len
        kwargs["centroid_index"] = None
        super().__init__(**kwargs)

    def _make_mixer(self, index: int, grid: tuple[int, int]) -> nn.Module:
        seq_len = self.num_prefix_tokens + grid[0] * grid[1]
        return LinformerAttention(self.embed_dim, self._num_heads, seq_len, self.proj_len, qkv_bias=self._qkv_bias)


def _collapse(keys: list[str]) -> str:
    """``blocks.0.attn.inducing, blocks.1.attn.inducing, ...`` -> ``blocks.*.attn.inducing (x12)``."""
    counts: dict[str, int] = {}
    for key in keys:
        pattern = re.sub(r"^blocks\.\d+\.", "blocks.*.", key)
        counts[pattern] = counts.get(pattern, 0) + 1
    return ", ".join(f"{p} (x{n})" if n > 1 else p for p, n in counts.items())


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: CentroidViT) -> dict[str, Tensor]:
    """Maps a DeiT state dict (timm's key layout) onto a baseline; parameters DeiT lacks keep the model's init.

    The shared keys go through :func:`vision.centroid_deit.checkpoint_filter_fn` (position embedding resampled,
    distillation token dropped). A key the model lacks is dropped, and one whose shape differs (e.g. the head for
    another ``num_classes``) keeps the model's value; both are logged as warnings. The baseline-specific parameters
    (inducing points, ``norm_h``, Linformer's ``proj_k`` / ``proj_v``) are logged at INFO.

    Returns:
        A complete state dict for ``model`` (``load_state_dict(..., strict=True)`` succeeds).
    """
    mapped = _deit_filter(state_dict, model)
    target = model.state_dict()
    dropped = [k for k in mapped if k not in target]
    mismatched = [k for k in mapped if k in target and mapped[k].shape != target[k].shape]
    out = {k: v for k, v in mapped.items() if k in target and k not in mismatched}
    kept = [k for k in target if k not in out]
    for key in kept:
        out[key] = target[key]
    not_loaded = [k for k in kept if k not in mismatched]
    if not_loaded:
        _logger.info("%s: not in the DeiT checkpoint, kept at init: %s", type(model).__name__, _collapse(not_loaded))
    if mismatched:
        _logger.warning(
            "%s: shape differs from the checkpoint, kept at init: %s",
            type(model).__name__,
            ", ".join(f"{k} {tuple(mapped[k].shape)} vs {tuple(target[k].shape)}" for k in mismatched),
        )
    if dropped:
        _logger.warning("%s: checkpoint keys with no place in the model, dropped: %s", type(model).__name__,
                        _collapse(dropped))  # fmt: skip
    return out


def _create_baseline(variant: str, pretrained: bool, model_cls: type[CentroidViT], **kwargs) -> CentroidViT:
    return _create_centroid_deit(variant, pretrained, model_cls=model_cls, filter_fn=checkpoint_filter_fn, **kwargs)


default_cfgs = generate_default_cfgs(
    {
        "settrans_deit_tiny_patch16_224": _cfg(),
        "settrans_deit_small_patch16_224": _cfg(),
        "linformer_deit_tiny_patch16_224": _cfg(),
        "linformer_deit_small_patch16_224": _cfg(),
    }
)


@register_model
def settrans_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> SetTransformerViT:
    """Set Transformer (ISAB, 64 inducing points) DeiT-tiny."""
    return _create_baseline("settrans_deit_tiny_patch16_224", pretrained, SetTransformerViT, **dict(_TINY, **kwargs))


@register_model
def settrans_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> SetTransformerViT:
    """Set Transformer (ISAB, 64 inducing points) DeiT-small."""
    return _create_baseline("settrans_deit_small_patch16_224", pretrained, SetTransformerViT, **dict(_SMALL, **kwargs))


@register_model
def linformer_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> LinformerViT:
    """Linformer (k = 128) DeiT-tiny."""
    return _create_baseline("linformer_deit_tiny_patch16_224", pretrained, LinformerViT, **dict(_TINY, **kwargs))


@register_model
def linformer_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> LinformerViT:
    """Linformer (k = 128) DeiT-small."""
    return _create_baseline("linformer_deit_small_patch16_224", pretrained, LinformerViT, **dict(_SMALL, **kwargs))
