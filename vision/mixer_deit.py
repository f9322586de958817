"""DeiT with every block's self-attention replaced by a sequence mixer from :data:`attention.MIXERS`.

The skeleton is :class:`vision.centroid_deit.CentroidViT` with no centroid block and ``mixer=<name>`` (same stem,
class token, position embedding, pre-norm blocks, head). Mixers that need ``max_len`` (FSAT) get the token count
``1 + grid`` at construction, so these models are fixed to their ``img_size``. The centroid DeiTs take the same
keyword: ``timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer="cauchy")`` keeps the centroid block and
swaps the mixer of every other block.

FSAT: Zhuang et al., ACL 2022. Hydra and the matrix mixers: Hwang et al., arXiv:2407.09941.
"""

from __future__ import annotations

from timm.models import generate_default_cfgs, register_model

from .centroid_deit import _SMALL, _TINY, CentroidViT, _cfg, _create_centroid_deit

__all__: list[str] = []

MIXER_VARIANTS = ("fsat", "fat", "hydra", "cauchy", "vandermonde", "toeplitz")

default_cfgs = generate_default_cfgs(
    {f"{mixer}_deit_{size}_patch16_224": _cfg() for mixer in MIXER_VARIANTS for size in ("tiny", "small")}
)


def _create_mixer_deit(variant: str, pretrained: bool, mixer: str, size: dict, **kwargs) -> CentroidViT:
    args = {**size, "centroid_index": None, "mixer": mixer, **kwargs}
    return _create_centroid_deit(variant, pretrained, **args)


@register_model
def fsat_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block FSAT (4 predicted edges per key and head)."""
    return _create_mixer_deit("fsat_deit_tiny_patch16_224", pretrained, "fsat", _TINY, **kwargs)


@register_model
def fsat_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block FSAT."""
    return _create_mixer_deit("fsat_deit_small_patch16_224", pretrained, "fsat", _SMALL, **kwargs)


@register_model
def fat_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block FAT (attention to the Fourier-pooled cross)."""
    return _create_mixer_deit("fat_deit_tiny_patch16_224", pretrained, "fat", _TINY, **kwargs)


@register_model
def fat_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block FAT."""
    return _create_mixer_deit("fat_deit_small_patch16_224", pretrained, "fat", _SMALL, **kwargs)


@register_model
def hydra_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block Hydra's quasiseparable mixer (bidirectional scans in raster order)."""
    return _create_mixer_deit("hydra_deit_tiny_patch16_224", pretrained, "hydra", _TINY, **kwargs)


@register_model
def hydra_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block Hydra's quasiseparable mixer."""
    return _create_mixer_deit("hydra_deit_small_patch16_224", pretrained, "hydra", _SMALL, **kwargs)


@register_model
def cauchy_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block the Cauchy matrix mixer."""
    return _create_mixer_deit("cauchy_deit_tiny_patch16_224", pretrained, "cauchy", _TINY, **kwargs)


@register_model
def cauchy_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block the Cauchy matrix mixer."""
    return _create_mixer_deit("cauchy_deit_small_patch16_224", pretrained, "cauchy", _SMALL, **kwargs)


@register_model
def vandermonde_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block the Vandermonde matrix mixer."""
    return _create_mixer_deit("vandermonde_deit_tiny_patch16_224", pretrained, "vandermonde", _TINY, **kwargs)


@register_model
def vandermonde_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block the Vandermonde matrix mixer."""
    return _create_mixer_deit("vandermonde_deit_small_patch16_224", pretrained, "vandermonde", _SMALL, **kwargs)


@register_model
def toeplitz_deit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-tiny, every block the Toeplitz (FFT convolution) matrix mixer."""
    return _create_mixer_deit("toeplitz_deit_tiny_patch16_224", pretrained, "toeplitz", _TINY, **kwargs)


@register_model
def toeplitz_deit_small_patch16_224(pretrained: bool = False, **kwargs) -> CentroidViT:
    """DeiT-small, every block the Toeplitz (FFT convolution) matrix mixer."""
    return _create_mixer_deit("toeplitz_deit_small_patch16_224", pretrained, "toeplitz", _SMALL, **kwargs)
