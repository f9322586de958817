"""Centroid attention: attention from M centroids to N inputs, the layer that lets a network shorten its sequence.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606.

* :mod:`.functional`: the op (:func:`centroid_attention`, dense or over K nearest inputs, two normalizations) and
  its traceable dense / chunked KNN cores.
* :mod:`.layer`: :class:`CentroidAttention`, T steps with the skip (one forward that FX, TorchScript and dynamo follow).
* :mod:`.inits`: the centroid inits (:data:`CENTROID_INITS`).
* :mod:`.blocks`: :class:`CentroidBlock` and :class:`SelfAttentionBlock`.
"""

from ..layers import Mlp
from .blocks import CentroidBlock, SelfAttentionBlock
from .functional import (
    ATTN_CHUNK_BYTES,
    ATTN_CHUNK_BYTES_CUDA,
    MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR,
    NORMALIZATIONS,
    attn_chunk_bytes,
    centroid_attention,
    check_neighbor_idx,
    dense_centroid_attention,
    edge_attention,
    knn_centroid_attention,
    masked_knn_attention,
)
from .inits import (
    CENTROID_INITS,
    CentroidOutput,
    DWConv2dInit,
    FPSInit,
    KMeansInit,
    LinearInit,
    MeanPoolInit,
    RandomInit,
    build_centroid_init,
    resolve_num_centroids,
)
from .layer import CentroidAttention, feature_neighbors

__all__ = [
    "ATTN_CHUNK_BYTES",
    "ATTN_CHUNK_BYTES_CUDA",
    "CENTROID_INITS",
    "MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR",
    "NORMALIZATIONS",
    "CentroidAttention",
    "CentroidBlock",
    "CentroidOutput",
    "DWConv2dInit",
    "FPSInit",
    "KMeansInit",
    "LinearInit",
    "MeanPoolInit",
    "Mlp",
    "RandomInit",
    "SelfAttentionBlock",
    "attn_chunk_bytes",
    "build_centroid_init",
    "centroid_attention",
    "check_neighbor_idx",
    "dense_centroid_attention",
    "edge_attention",
    "feature_neighbors",
    "knn_centroid_attention",
    "masked_knn_attention",
    "resolve_num_centroids",
]
