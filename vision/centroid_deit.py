"""DeiT with one centroid block mid-network: a vision transformer that shortens its token sequence by 4x.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606, section 3.4, on top of
DeiT (Touvron et al., "Training data-efficient image transformers & distillation through attention",
arXiv:2012.12877).

The network is a DeiT (pre-norm ViT, class token, absolute position embedding, 12 blocks) in which block index
``k = centroid_index`` is a centroid block ("centroid @ k": k full-resolution blocks run before it)::

    patches  x_1..x_N                    (N = h x w grid, row-major; the class token c is kept apart)
    u^0      = DWConv_{3x3, stride 2, pad 1}(x on its h x w grid)       # M = ceil(h/2) * ceil(w/2) = N/4 centroids
    [c'; u'] = [c; u^0] + Proj(MHA(q = LN_q([c; u^0]), k, v = LN_kv([c; x_1..x_N])))     # T = 1 step
    out      = [c'; u'] + MLP(LN([c'; u']))                                              # (B, 1 + M, C)

and the blocks after it are ordinary blocks on 1 + N/4 tokens (at 224 px: 1 + 196 -> 1 + 49; overlap: 1 + 256 ->
1 + 64). Feature maps have stride 16 before the centroid block and 32 after it (14 -> 28 with the overlapping stem).

Choices the paper leaves open, made here:

* **Class token.** It is one more query of the centroid block's attention and one more key/value: queries are
  ``[c; u^0]``, keys/values ``[c; x_1..x_N]``. So the class token gets exactly the update a DeiT block would give it
  (it reads all patch tokens), and the centroids can read it too. Loaded from a DeiT checkpoint (both norms = the
  DeiT block's ``norm1``), the class token's output of the centroid block equals that DeiT block's.
* **Position embedding.** One absolute embedding, for the class token and the first grid only (as DeiT's); the
  centroids inherit position from the depth-wise conv over their 3 x 3 neighbourhood and get no second embedding.
* **Overlapping stem** (the "overlap" variants): ``Conv2d(3, C, kernel 16, stride 14, padding 1)``, i.e. 16 x 16 =
  256 tokens at 224 px, see :class:`OverlapPatchEmbed` (timm's ``PatchEmbed`` needs stride = kernel). A DeiT
  checkpoint's 16 x 16 kernel loads unchanged; its 14 x 14 position embedding is resampled to 16 x 16.
* **Init.** The depth-wise conv starts as a 3 x 3 averaging filter (:class:`attention.DWConv2dInit` with
  ``avg_init=True``), so a pretrained DeiT's tokens enter the centroid step as local means.

Numbers: ``tools/model_stats.py --family vision`` counts params and GMACs against the paper's (:mod:`vision.stats`).
Ours-1, -2, -4 and -5 match. The "@7" rows (Ours-3, -6) count fewer GMACs than the paper's, which the same models
reach with ``centroid_index=8``, i.e. eight full-resolution blocks: this suggests an off-by-one in the paper's labels
for those rows. Their paper params' extra +0.1 / +0.2 M are not explained by any block placement (placement does not
change the parameter count) and we do not add parameters to chase them. The registered names keep the paper's "c7".

Implementation notes: the centroid block is the core's :class:`attention.CentroidAttention` (dense, T = 1, with
DropPath on its update) and :class:`attention.DWConv2dInit`, unchanged: their forward is traceable (validation runs
in eager mode only), so ``torch.fx``, TorchScript, dynamo and ``torch.export`` follow the model. This module does not
use ``from __future__ import annotations``: ``torch.fx`` copies the root ``forward``'s annotations into its generated
code, where a string annotation (``"Tensor"``) becomes the name ``_Tensor_`` that TorchScript cannot resolve when
scripting the FX graph. All grid sizes are computed from ``img_size`` at construction.
"""

from collections.abc import Callable
from functools import partial

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    Attention,
    DropPath,
    Mlp,
    PatchEmbed,
    is_scriptable,
    register_notrace_module,
    resample_abs_pos_embed,
    resample_patch_embed,
    to_2tuple,
    trunc_normal_,
)
from timm.models import build_model_with_cfg, checkpoint_seq, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint
from torch import Tensor, nn

from attention.centroid import CentroidAttention, DWConv2dInit
from attention.mixers import MIXERS, UNSCRIPTABLE_MIXERS, build_mixer

__all__ = [
    "Block",
    "CentroidViT",
    "GridCentroidBlock",
    "OverlapPatchEmbed",
    "checkpoint_filter_fn",
]


# --------------------------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------------------------


class OverlapPatchEmbed(nn.Module):
    """Image to overlapping patch tokens: ``Conv2d(kernel patch_size, stride, padding)``, flattened row-major.

    With kernel 16, stride 14, padding 1 a 224 px image gives a 16 x 16 grid (``(224 + 2 - 16) // 14 + 1``).

    Shapes:
        x: ``(B, in_chans, H, W)`` with ``(H, W) = img_size``; output: ``(B, N, embed_dim)``, N = grid h * w.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        stride: int = 14,
        padding: int = 1,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        self.stride, self.padding = stride, padding
        self.grid_size = tuple((s + 2 * padding - patch_size) // stride + 1 for s in self.img_size)
        if min(self.grid_size) < 1:
            raise ValueError(f"img_size {self.img_size} is smaller than one patch ({patch_size} px, padding {padding})")
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=stride, padding=padding)

    def feat_ratio(self, as_scalar: bool = True) -> int | tuple[int, int]:
        return self.stride if as_scalar else (self.stride, self.stride)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, C)


class Block(nn.Module):
    """Pre-norm transformer block (DeiT's), ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``, with DropPath.

    ``attn`` replaces the multi-head self-attention (timm's ``Attention``) by another token mixer (the baselines).

    Shapes:
        x: ``(B, L, C)``; output: ``(B, L, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
        attn: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = (
            attn
            if attn is not None
            else Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class GridCentroidBlock(nn.Module):
    """The centroid block: N grid tokens -> M = N/4 centroids (depth-wise conv init, one attention step, MLP).

    The ``num_prefix_tokens`` prefix (the class token) is both a query and a key/value of the attention step (see the
    module docstring); the output keeps it first.

    Args:
        dim: channels C.
        num_heads: attention heads.
        grid_size: ``(h, w)`` of the patch tokens entering the block.
        num_prefix_tokens: tokens before the grid (1: the class token).
        num_steps: T, centroid-attention steps (the paper's vision model uses 1).
        other args: as :class:`Block`.

    Shapes:
        x: ``(B, P + N, C)``, N = h * w; output: ``(B, P + M, C)``, M = ceil(h / 2) * ceil(w / 2).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        grid_size: tuple[int, int],
        num_prefix_tokens: int = 1,
        num_steps: int = 1,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.num_prefix_tokens = num_prefix_tokens
        self.init = DWConv2dInit(dim, grid_size, kernel_size=3, stride=2, avg_init=True)
        self.grid_size = self.init.grid_size
        self.out_grid_size = self.init.out_grid_size
        self.attn = CentroidAttention(
            dim,
            num_heads=num_heads,
            num_steps=num_steps,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            drop_path=drop_path,
            validate_inputs=False,  # internal activations: a NaN check here would be a host sync in every forward
        )
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        P = self.num_prefix_tokens
        prefix, patches = x[:, :P], x[:, P:]  # (B, P, C), (B, N, C)
        u = torch.cat([prefix, self.init(patches).x], dim=1)  # (B, P + M, C) queries
        u = self.attn(x, u)  # keys / values: all P + N tokens
        return u + self.drop_path2(self.mlp(self.norm2(u)))


# --------------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------------


class CentroidViT(nn.Module):
    """DeiT-style vision transformer whose block ``centroid_index`` is a :class:`GridCentroidBlock`.

    ``in_chans``, ``num_classes``, ``global_pool`` (``"token"`` or ``"avg"``), ``embed_dim``, ``depth``, ``num_heads``,
    ``mlp_ratio``, ``qkv_bias``, ``drop_rate``, ``pos_drop_rate``, ``proj_drop_rate``, ``attn_drop_rate`` and
    ``drop_path_rate`` are as in timm's ViT.

    Args:
        img_size: input size; every token grid is computed from it at construction.
        patch_size: patch (kernel) size of the stem.
        patch_stride: stem stride; ``None`` = ``patch_size`` (timm's ``PatchEmbed``), else :class:`OverlapPatchEmbed`
            with ``patch_padding``.
        patch_padding: padding of the overlapping stem.
        centroid_index: index of the centroid block (``None``: a plain DeiT, used by the baselines).
        centroid_steps: T of the centroid block.
        mixer: None (multi-head self-attention), or a name from :data:`attention.MIXERS` (``"cauchy"``, ``"fsat"``,
            ...): every ordinary block's self-attention becomes that sequence mixer (the centroid block stays);
            mixers that need ``max_len`` get the block's token count (class token + grid).

    Shapes:
        x: ``(B, in_chans, H, W)``; ``forward_features``: ``(B, 1 + L, C)`` with L = N or N/4 (after the centroid
        block); ``forward``: ``(B, num_classes)``.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        patch_stride: int | None = None,
        patch_padding: int = 0,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        centroid_index: int | None = 6,
        centroid_steps: int = 1,
        mixer: str | None = None,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_layer: Callable[[int], nn.Module] | None = None,
        act_layer: type[nn.Module] = nn.GELU,
    ) -> None:
        super().__init__()
        if mixer is not None and (not isinstance(mixer, str) or mixer not in MIXERS):
            raise ValueError(f"unknown mixer {mixer!r}; choose one of {sorted(MIXERS)} (None: multi-head attention)")
        if mixer in UNSCRIPTABLE_MIXERS and is_scriptable():
            raise RuntimeError(
                f"mixer {mixer!r} cannot be scripted by TorchScript, but timm's set_scriptable(True) is on: build the "
                "model outside set_scriptable, and use torch.fx, torch.compile or torch.export instead"
            )
        if global_pool not in ("token", "avg", ""):
            raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
        if centroid_index is not None and not 0 <= centroid_index < depth:
            raise ValueError(f"centroid_index must be in [0, depth={depth}) or None, got {centroid_index}")
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1
        self.centroid_index = centroid_index
        self.grad_checkpointing = False
        self._num_heads, self._qkv_bias = num_heads, qkv_bias  # read by the baselines' _make_mixer
        self.mixer = mixer

        if patch_stride is None or (patch_stride == patch_size and patch_padding == 0):
            self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
            stem_stride = patch_size
        else:
            self.patch_embed = OverlapPatchEmbed(img_size, patch_size, patch_stride, patch_padding, in_chans, embed_dim)
            stem_stride = patch_stride
        grid = tuple(int(s) for s in self.patch_embed.grid_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + grid[0] * grid[1], embed_dim))  # class token + first grid
        self.pos_drop = nn.Dropout(pos_drop_rate)

        dpr = [r.item() for r in torch.linspace(0, drop_path_rate, depth)]
        common = dict(
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            proj_drop=proj_drop_rate,
            attn_drop=attn_drop_rate,
            act_layer=act_layer,
            norm_layer=norm_layer,
        )
        blocks, grids, reductions = [], [], []
        reduction = stem_stride
        for i in range(depth):
            if i == centroid_index:
                blk = GridCentroidBlock(
                    embed_dim, num_heads, grid, num_steps=centroid_steps, drop_path=dpr[i], **common
                )
                grid, reduction = blk.out_grid_size, reduction * 2
            else:
                blk = Block(embed_dim, num_heads, drop_path=dpr[i], attn=self._make_mixer(i, grid), **common)
            blocks.append(blk)
            grids.append(grid)
            reductions.append(reduction)
        self.blocks = nn.Sequential(*blocks)
        self.block_grids = grids  # (h, w) of each block's output tokens
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=r) for i, r in enumerate(reductions)
        ]
        self.norm = norm_layer(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    def _make_mixer(self, index: int, grid: tuple[int, int]) -> nn.Module | None:
        """Token mixer of ordinary block ``index`` on a ``grid`` of patch tokens; None = multi-head self-attention.

        The mixer's class is registered as an FX leaf (timm's ``register_notrace_module``): its chunked loops and
        custom autograd Functions run as one call in FX graphs (feature extraction), as timm does for its own.
        """
        if self.mixer is None:
            return None
        seq_len = self.num_prefix_tokens + grid[0] * grid[1]
        module = build_mixer(self.mixer, self.embed_dim, self._num_heads, max_len=seq_len, qkv_bias=self._qkv_bias)
        register_notrace_module(type(module))
        return module

    def init_weights(self) -> None:
        """timm's ViT init: trunc-normal(0.02) linear weights and position embedding; convs keep their own init."""
        trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^cls_token|pos_embed|patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("token", "avg", ""):
                raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def _pos_embed(self, x: Tensor) -> Tensor:
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, C)
        return self.pos_drop(x + self.pos_embed)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """Each selected block's output; NCHW maps use that block's grid (it shrinks 2x at the centroid block).

        Args:
            x: ``(B, 3, H, W)`` images.
            indices: the last n blocks if an int, all if None, else these block indices.
            return_prefix_tokens: pair each intermediate with its class token ``(B, 1, C)`` (not in TorchScript).
            norm: apply the final norm to the intermediates.
            stop_early: stop after the last selected block.
            output_fmt: ``"NCHW"`` (``(B, C, h, w)``) or ``"NLC"`` (``(B, h * w, C)``).
            intermediates_only: return only the intermediates.

        Returns:
            The intermediates, or ``(final normed features, intermediates)``.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        B = x.shape[0]
        x = self._pos_embed(self.patch_embed(x))
        if torch.jit.is_scripting() or not stop_early:  # blocks cannot be sliced in TorchScript
            blocks = self.blocks
        else:
            blocks = self.blocks[: max_index + 1]
        intermediates: list[Tensor] = []
        prefix_tokens: list[Tensor] = []
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
            if i in take_indices:
                y = self.norm(x) if norm else x
                prefix_tokens.append(y[:, : self.num_prefix_tokens])
                y = y[:, self.num_prefix_tokens :]  # (B, h * w, C)
                if output_fmt == "NCHW":
                    h, w = self.block_grids[i]
                    y = y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()  # (B, C, h, w)
                intermediates.append(y)
        if not torch.jit.is_scripting() and return_prefix_tokens:
            intermediates = list(zip(intermediates, prefix_tokens))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drops the blocks after the last of ``indices`` (and the norm / head); returns the kept indices."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices

    def forward_features(self, x: Tensor) -> Tensor:
        x = self._pos_embed(self.patch_embed(x))  # (B, 1 + N, C)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)  # (B, 1 + N / 4, C) after the centroid block
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        elif self.global_pool == "token":
            x = x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


# --------------------------------------------------------------------------------------------------------------------
# Loading DeiT checkpoints
# --------------------------------------------------------------------------------------------------------------------


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: CentroidViT) -> dict[str, Tensor]:
    """Maps a DeiT state dict (timm's key layout) onto ``model``.

    * Block ``k = model.centroid_index``: ``norm1`` -> ``attn.norm_q`` and ``attn.norm_kv``; ``attn.qkv`` (rows
      ``[q; k; v]``) -> ``attn.q`` (first C rows) and ``attn.kv`` (last 2C rows); ``attn.proj``, ``norm2``, ``mlp``
      keep their names. The depth-wise conv (absent from DeiT) is taken from ``model`` (its averaging init).
    * ``pos_embed`` is resampled to the model's first grid (e.g. 14 x 14 -> 16 x 16 for the overlap stem, or another
      ``img_size``); ``patch_embed.proj.weight`` is resampled only if the kernel size differs (the overlap stem keeps
      the 16 x 16 kernel, only its stride changes).
    * Distilled DeiT checkpoints: the distillation token, its position and ``head_dist`` are dropped.
    """
    state_dict = state_dict.get("model", state_dict)
    state_dict = dict(state_dict)
    target = model.state_dict()
    out: dict[str, Tensor] = {}
    num_prefix = 1
    if "dist_token" in state_dict:
        state_dict.pop("dist_token")
        state_dict.pop("head_dist.weight", None)
        state_dict.pop("head_dist.bias", None)
        pe = state_dict["pos_embed"]
        state_dict["pos_embed"] = torch.cat([pe[:, :1], pe[:, 2:]], dim=1)
    k = model.centroid_index
    for key, v in state_dict.items():
        if key == "pos_embed" and v.shape != target["pos_embed"].shape:
            v = resample_abs_pos_embed(
                v, new_size=list(model.patch_embed.grid_size), num_prefix_tokens=num_prefix, verbose=False
            )
        elif key == "patch_embed.proj.weight" and v.shape[-2:] != target[key].shape[-2:]:
            v = resample_patch_embed(v, list(target[key].shape[-2:]), verbose=False)
        if k is not None and key.startswith(f"blocks.{k}."):
            rest = key[len(f"blocks.{k}.") :]
            if rest.startswith("norm1."):
                leaf = rest[len("norm1.") :]
                out[f"blocks.{k}.attn.norm_q.{leaf}"] = v
                out[f"blocks.{k}.attn.norm_kv.{leaf}"] = v
                continue
            if rest.startswith("attn.qkv."):
                leaf = rest[len("attn.qkv.") :]
                C = v.shape[0] // 3
                out[f"blocks.{k}.attn.q.{leaf}"] = v[:C]
                out[f"blocks.{k}.attn.kv.{leaf}"] = v[C:]
                continue
        out[key] = v
    for key in target:
        if k is not None and key.startswith(f"blocks.{k}.init.") and key not in out:
            out[key] = target[key]  # the depth-wise conv keeps its averaging init
    return out


# --------------------------------------------------------------------------------------------------------------------
# Configs and registered variants
# --------------------------------------------------------------------------------------------------------------------


def _cfg(**kwargs) -> dict:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "paper_ids": "arXiv:2102.08606",
        **kwargs,
    }


default_cfgs = generate_default_cfgs(
    {
        "centroid_deit_tiny_c6_patch16_224": _cfg(),
        "centroid_deit_tiny_c5_overlap_patch16_224": _cfg(),
        "centroid_deit_tiny_c7_overlap_patch16_224": _cfg(),
        "centroid_deit_small_c6_patch16_224": _cfg(),
        "centroid_deit_small_c5_overlap_patch16_224": _cfg(),
        "centroid_deit_small_c7_overlap_patch16_224": _cfg(),
    }
)


def _create_centroid_deit(
    variant: str,
    pretrained: bool = False,
    model_cls: type[CentroidViT] | None = None,
    filter_fn: Callable[[dict[str, Tensor], CentroidViT], dict[str, Tensor]] | None = None,
    **kwargs,
) -> CentroidViT:
    """timm's builder for :class:`CentroidViT` (or a subclass, e.g. the baselines) with a checkpoint filter
    (default :func:`checkpoint_filter_fn`). A local ``.safetensors`` given as ``pretrained_cfg_overlay=dict(file=...)``
    (what ``tools/export_weights.py`` writes) is checked first (:func:`engine.weights.load_weights`: its digest,
    finite values), as the registries' ``checkpoint=`` is."""
    file = (kwargs.get("pretrained_cfg_overlay") or {}).get("file")
    if pretrained and file is not None and str(file).endswith(".safetensors"):
        from engine.weights import load_weights

        load_weights(file)
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        model_cls or CentroidViT,
        variant,
        pretrained,
        pretrained_filter_fn=filter_fn or checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )


_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
_OVERLAP = dict(patch_stride=14, patch_padding=1)


@register_model
def centroid_deit_tiny_c6_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-1: DeiT-tiny, 196 tokens, centroid block at index 6 (196 -> 49 tokens)."""
    args = dict(_TINY, centroid_index=6)
    return _create_centroid_deit("centroid_deit_tiny_c6_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def centroid_deit_tiny_c5_overlap_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-2: DeiT-tiny, overlapping stem (256 tokens), centroid block at index 5 (256 -> 64 tokens)."""
    args = dict(_TINY, **_OVERLAP, centroid_index=5)
    return _create_centroid_deit("centroid_deit_tiny_c5_overlap_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def centroid_deit_tiny_c7_overlap_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-3: DeiT-tiny, overlapping stem (256 tokens), centroid block at index 7 (256 -> 64 tokens)."""
    args = dict(_TINY, **_OVERLAP, centroid_index=7)
    return _create_centroid_deit("centroid_deit_tiny_c7_overlap_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def centroid_deit_small_c6_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-4: DeiT-small, 196 tokens, centroid block at index 6 (196 -> 49 tokens)."""
    args = dict(_SMALL, centroid_index=6)
    return _create_centroid_deit("centroid_deit_small_c6_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def centroid_deit_small_c5_overlap_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-5: DeiT-small, overlapping stem (256 tokens), centroid block at index 5 (256 -> 64 tokens)."""
    args = dict(_SMALL, **_OVERLAP, centroid_index=5)
    return _create_centroid_deit("centroid_deit_small_c5_overlap_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def centroid_deit_small_c7_overlap_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """Ours-6: DeiT-small, overlapping stem (256 tokens), centroid block at index 7 (256 -> 64 tokens)."""
    args = dict(_SMALL, **_OVERLAP, centroid_index=7)
    return _create_centroid_deit("centroid_deit_small_c7_overlap_patch16_224", pretrained, **dict(args, **kwargs))
