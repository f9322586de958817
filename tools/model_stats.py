"""Parameters and GMACs of every registered model, next to the papers' numbers.

    python tools/model_stats.py                                   # every family that has models
    python tools/model_stats.py --family pointcloud --points 2048
    python tools/model_stats.py --models centroid_transformer_modelnet40 --json stats.json
    python tools/model_stats.py --check                           # CI: exit 1 if a checked model is off the paper

One Markdown table per family; each row is a registered model, so a model appears here as soon as its package
registers it, and a paper number whose model is not registered yet is not printed. ``ratio`` = ours / paper.
Families (each declared by its package: ``pointcloud.stats``, ``capsules.stats``, ``vision.stats``):

* ``pointcloud``: ``pointcloud.list_models()`` on one cloud of ``--points`` xyz points (default 1024), 40 classes.
  Paper: the centroid transformer 4.1 M params, 5.4 GMACs (section 3.2; no separate numbers for the ablation
  twins); peers DGCNN 1.8 M and PointNet++ (SSG) 1.5 M params (their GMACs are not given).
  Two GMAC columns: ours (keys and values projected once per point, then gathered per neighbour) and "per-edge k/v",
  the same forward pass with KNN attention's key/value projections evaluated per (centroid, neighbour) edge
  (:func:`attention.edge_projection`, a module swap; outputs tested equal). The paper's 5.4 GMACs cannot come from
  per-point projections: with them this architecture counts 1.2-1.5 GMACs at 1024 points for any sensible N1, N2, K
  (3.7 with no downsampling at all, and K hardly matters), while per edge the count grows with K, which is how
  choosing N1, N2 and K can set it. So ``ratio`` and ``--check`` compare the paper with the per-edge column, the
  defaults (N1 = N / 2, N2 = N1 / 2, K = 24; see ``pointcloud/model.py``) are chosen on it, and the ``GMACs`` column
  is what our model actually costs.
* ``capsules``: ``capsules.list_models()`` with the reference code's decoder (``decoder="heads"``, the paper's
  architecture; the default patch decoder is one shared MLP of 0.07 M parameters) on one cloud of ``--points``
  points (default 2048; the decoder always emits 2048). Paper (section 3.3): dynamic routing 18.4 M (12 capsules) /
  19.8 M (64), centroid 0.6 M / 5.3 M; no GMACs. Measured: routing small 18.49 M matches, the others do not follow
  from the reference architecture.
  Where the parameters are (M): encoder 0.01; primary capsules 16 x Conv1d(128 -> P) + BN 1.07 (P = 512) / 2.15 (P =
  1024); routing W (M, P, D, 16) 12.58 (12 x 512 x 128 x 16) / 67.11 (64 x 1024 x 64 x 16); centroid latent layer
  (per-capsule lift 16 -> D of rank 16, linear init M x P, attention and MLP of width D) 0.25 / 0.15; AtlasNet
  decoder, 28.2 k per head x 171 heads = 4.82 (D = 128) / 7.5 k x 32 heads = 0.24 (D = 64). So routing small = 0.01 +
  1.07 + 12.58 + 4.82 = 18.5 (the paper's 18.4), but routing base is 69.5, not 19.8: W alone is 67 M at 1024 x 64 x 64
  x 16, so the paper's 64-capsule routing model must have used fewer primary capsules or smaller latent vectors than
  the stated 1024 x 16 -> 64 x 64 (e.g. P = 256 would give 16.8 + 0.5 + 0.24 = 17.6 M). Centroid small is 6.15 M, not
  0.6 M: the decoder alone (4.8 M, the same as routing's) exceeds 0.6 M, so the paper's figure can only count the
  latent layer and encoder (0.25 + 0.01 M, or with a lighter primary layer); centroid base is 2.5 M against 5.3 M,
  which would need a larger attention block or primary layer than the reference's. We keep the reference's encoder,
  primary capsules and decoder for both variants, so the two differ only in the latent layer.
* ``vision``: the timm models that ``import vision`` registers, on one 224 px image, with timm's DeiT-tiny and
  DeiT-small as references. Paper (section 3.4): Ours-1..6 = ``centroid_deit_{tiny,small}_{c6,c5_overlap,
  c7_overlap}_patch16_224``. The "centroid @ k" reading (k full-resolution blocks before the centroid block)
  reproduces Ours-1, -2, -4, -5; the @7 rows measure 1.18 / 4.27 GMACs against the paper's 1.3 / 4.7, which the
  same models reach with the centroid block one index later (``centroid_index=8``: 1.29 / 4.66), and their params
  (5.73 / 22.08 M) do not show the paper's +0.1 / +0.2 M (see ``vision/centroid_deit.py``).

GMACs are per sample (batch 1, eval mode), counted by :func:`engine.count_gmacs`, i.e. by
``torch.utils.flop_counter.FlopCounterMode`` with 1 MAC = 2 FLOPs. It counts the matmul-like aten ops that actually
run: linear layers, convolutions, ``bmm``/``baddbmm`` and ``scaled_dot_product_attention``, so the attention matmuls
(scores and weighted sums, dense or over the K gathered neighbours) are included, and so is the brute-force KNN
distance matrix in feature space (a ``baddbmm``; 0.04 GMACs of the centroid transformer at 1024 points). Not counted:
element-wise ops (norms, activations, softmax, residual adds), gather/scatter and indexing (neighbour gathering,
nearest-neighbour upsampling), sorting and top-k, farthest point sampling (a loop of element-wise ops) and
compiled extensions (torch_cluster's xyz KNN on CPU; with the brute-force backend instead, that KNN adds a few
MMACs). The cost of those point ops shows up in time, not in GMACs: see ``tools/bench_modelnet.py``.

``--check`` compares the models in a family's ``checks`` with the paper within a relative tolerance (the centroid
transformer: params 4.1 M +-15%, GMACs 5.4 +-25%) and exits with a message naming the measured and expected values.
"""

from __future__ import annotations

import sys

import capsules.stats
import pointcloud.stats
import vision.stats
from engine import model_stats

FAMILIES = {"pointcloud": pointcloud.stats.FAMILY, "capsules": capsules.stats.FAMILY, "vision": vision.stats.FAMILY}


if __name__ == "__main__":
    sys.exit(1 if any("error" in r for r in model_stats.main(FAMILIES, description=__doc__)) else 0)
