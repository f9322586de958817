"""The centroid-attention layer: T steps of multi-head attention from M centroids to N inputs, plus the skip.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606, eq. 4-6; the math and
the two normalizations are in :mod:`attention.centroid.functional`.

One forward for every consumer (point model, capsules, vision): no process-global switch and no data-dependent
Python branch is read inside it once it is traced. Input validation (:meth:`CentroidAttention.check_inputs`) runs
only in eager mode, behind :func:`attention.checks.checks_active` (off under FX, TorchScript, dynamo and export);
feature-space KNN (a no-grad search with its own backend choice) and the chunked KNN product are FX leaves.
No ``from __future__ import annotations`` here: TorchScript resolves the signatures of the ``@torch.jit.unused``
methods from their live annotations, not from strings.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backends import backend_names, resolve
from ..checks import check_heads, check_mask, check_points, checks_active
from ..layers import DropPath, LayerScale, RelativePositionEncoding
from ..points import gather, knn, knn_search
from .functional import (
    NORMALIZATIONS,
    _distinct_check,
    _knn_attention_shape,
    _knn_weights,
    check_neighbor_idx,
    dense_centroid_attention,
    knn_centroid_attention,
    knn_vector_attention,
    masked_knn_attention,
    triton_knn_attention,
)

__all__ = ["AGGREGATIONS", "CentroidAttention", "feature_neighbors"]

AGGREGATIONS = ("dot", "vector", "max")
"""How :class:`CentroidAttention` reads a centroid's neighbours: ``"dot"``, multi-head dot-product attention (the
paper); ``"vector"``, grouped vector attention (Point Transformer v2): a small MLP of ``q_i - k_j (+ delta_ij)`` gives
one weight per neighbour and group of channels; ``"max"``, a per-channel maximum over the neighbours' values
(PointNet++'s set-abstraction pool), no weights."""


def feature_neighbors(
    u: Tensor, x: Tensor, k: int, mask: Tensor | None, backend: str, validate: bool = True
) -> Tensor:  # fmt: skip
    """``(B, M, K)`` indices of the K inputs nearest each centroid in feature space (no gradient).

    ``validate=False`` searches without :func:`attention.knn`'s input checks (:func:`attention.points.knn_search`), for
    inputs the caller has validated: :class:`CentroidAttention` checks its inputs once per forward, and a second
    NaN/Inf scan of the same tensors would add two host syncs to every step on CUDA."""
    with torch.no_grad():
        if validate:
            return knn(u.detach(), x.detach(), k, mask=mask, backend=backend)[1]
        return knn_search(u.detach(), x.detach(), k, mask, backend)[1]


# FX keeps these as single calls: a no-grad search with backend dispatch, chunked custom autograd Functions, and a
# Triton kernel.
torch.fx.wrap("feature_neighbors")
torch.fx.wrap("knn_centroid_attention")
torch.fx.wrap("knn_vector_attention")
torch.fx.wrap("triton_knn_attention")


class CentroidAttention(nn.Module):
    """T steps of ``u <- u + proj(MHA(q(norm(u)), k(norm(x)), v(norm(x))))``, dense or over K nearest inputs.

    Args:
        dim: channels C of inputs and centroids.
        num_heads: H; ``dim`` must be divisible by it.
        num_neighbors: K, the number of nearest inputs (in feature space) each centroid attends to; None = all.
        num_steps: T, the number of unrolled steps (shared weights).
        normalize: ``"inputs"`` or ``"centroids"`` (see the module docstring).
        qkv_bias: bias in the q, k, v projections.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
        norm_layer: pre-norm applied to centroids (each step) and inputs; None for no norm.
        share_norm: use one norm for centroids and inputs (a self-attention block).
        knn_backend: backend of :func:`attention.knn`.
        attn_backend: form of the KNN attention: ``"gather"`` (chunked gathers), ``"masked"`` (dense products under
            the neighbour mask, :func:`attention.centroid.masked_knn_attention`), ``"triton"`` (the fused kernel,
            :func:`attention.centroid.triton_knn_attention`: CUDA, ``normalize="inputs"``, no attention dropout while
            training) or ``"auto"`` (on CUDA ``"triton"`` where it applies, else ``"masked"`` while N / K <=
            ``attention.backends.MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR`` and ``normalize="inputs"``, else ``"gather"``;
            on CPU and while traced ``"gather"``). The masked form counts a repeated neighbour index once: while the
            layer checks its inputs, a given ``neighbor_idx`` that repeats one in a row keeps ``"auto"`` off it and
            makes ``"masked"`` raise; with checks off it is taken to repeat none (a KNN search's never does).
        drop_path: stochastic depth on each step's update (timm's DropPath; the vision models use it).
        validate_inputs: check the inputs in eager mode (:meth:`check_inputs`, behind
            :func:`attention.checks.checks_active`). False for a layer inside a model that validates its own input:
            the NaN/Inf check is a reduction and a host sync on every call, which stalls a GPU's queue (the vision
            models validate nothing past the image, like timm's).
        pos_encoding: add a learned encoding of each edge's relative position ``delta(p_j - p_i)``
            (:class:`attention.RelativePositionEncoding`, Point Transformer's form) to the neighbour's key and value;
            the forward then needs ``pos`` and ``centroid_pos``, and neighbours (``num_neighbors`` or
            ``neighbor_idx``). It runs the chunked gather form (:func:`knn_centroid_attention`), which adds the
            encoding's share per head from its hidden features: memory O(M K R) for R = ``pos_hidden``.
        pos_dim: coordinates per position for ``pos_encoding`` (3 for xyz).
        pos_hidden: hidden width of the position encoding's MLP.
        layer_scale: None (default) adds each step's update as it is; a float scales it per channel by a learned
            :class:`attention.LayerScale` initialised to that value (0.0: each step starts as the identity, so a
            centroid block starts as its downsampling-only twin).
        aggregation: one of :data:`AGGREGATIONS`. ``"vector"`` and ``"max"`` need neighbours and read them per edge
            (gathered keys and values, memory O(M K C)): the ``attn_backend`` forms are the dot product's, so they
            take ``"auto"`` or ``"gather"`` only. ``"vector"`` uses ``num_heads`` as its G groups of channels (G = C:
            one weight per channel); its logits are ``w2(relu(w1(q_i - k_j + delta_ij)))`` and its values
            ``v_j + delta_ij`` (``delta`` with ``pos_encoding``, else 0). ``"max"`` takes ``max_j (v_j + delta_ij)``
            per channel; ``attn_drop`` and ``normalize`` do not apply to it.

    Shapes:
        x: ``(B, N, C)`` inputs; centroids: ``(B, M, C)``; mask: ``(B, N)`` bool (True = real input);
        neighbor_idx: ``(B, M, K)`` fixed neighbours (e.g. from coordinates) instead of feature-space KNN;
        pos: ``(B, N, P)`` and centroid_pos: ``(B, M, P)`` positions (``pos_encoding`` only); output: ``(B, M, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 4,
        num_neighbors: int | None = None,
        num_steps: int = 1,
        normalize: str = "inputs",
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = nn.LayerNorm,
        share_norm: bool = False,
        knn_backend: str = "auto",
        drop_path: float = 0.0,
        validate_inputs: bool = True,
        attn_backend: str = "auto",
        pos_encoding: bool = False,
        pos_dim: int = 3,
        pos_hidden: int = 16,
        layer_scale: float | None = None,
        aggregation: str = "dot",
    ) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if aggregation != "dot" and attn_backend not in ("auto", "gather"):
            raise ValueError(
                f"attn_backend={attn_backend!r} is a form of the dot-product attention; aggregation={aggregation!r} "
                "reads its neighbours per edge: use attn_backend='auto' or 'gather'"
            )
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        if num_neighbors is not None and num_neighbors < 1:
            raise ValueError(f"num_neighbors must be None or a positive int, got {num_neighbors}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.num_neighbors = num_neighbors
        self.num_steps = num_steps
        self.normalize = normalize
        self.knn_backend = knn_backend
        if attn_backend not in ("auto", *backend_names("knn_attention")):
            raise ValueError(
                f"unknown attn_backend {attn_backend!r}; choose one of {['auto', *backend_names('knn_attention')]}"
            )
        self.attn_backend = attn_backend
        self.validate_inputs = validate_inputs
        self.norm_q = norm_layer(dim) if norm_layer is not None else nn.Identity()
        self.norm_kv = self.norm_q if share_norm else (norm_layer(dim) if norm_layer is not None else nn.Identity())
        # "max" reads no query: the centroids enter only through the skip (and the neighbour search)
        self.q = nn.Linear(dim, dim, bias=qkv_bias) if aggregation != "max" else None
        if aggregation == "max" and not share_norm:
            self.norm_q = nn.Identity()
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.pos_encoding = pos_encoding
        self.pos_enc = RelativePositionEncoding(dim, pos_dim, pos_hidden) if pos_encoding else None
        self.layer_scale = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.aggregation = aggregation
        # the logits of grouped vector attention: Point Transformer v2's weight encoding without its BatchNorm
        self.weight_enc = (
            nn.Sequential(nn.Linear(dim, num_heads), nn.ReLU(), nn.Linear(num_heads, num_heads))
            if aggregation == "vector"
            else None
        )

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_neighbors={self.num_neighbors}, "
            f"num_steps={self.num_steps}, normalize={self.normalize!r}, pos_encoding={self.pos_encoding}, "
            f"aggregation={self.aggregation!r}"
        )

    @torch.jit.unused
    def check_inputs(
        self,
        x: Tensor,
        centroids: Tensor,
        mask: Tensor | None = None,
        neighbor_idx: Tensor | None = None,
        pos: Tensor | None = None,
        centroid_pos: Tensor | None = None,
    ) -> None:
        """Raises a ``ValueError`` / ``TypeError`` naming what was expected if the inputs of :meth:`forward` are
        malformed (ranks, channels, M <= N, K <= N, mask, neighbour indices, positions, NaN/Inf)."""
        check_points(x, "x", channels=self.dim)
        check_points(centroids, "centroids", like=x, like_name="x")
        B, N, _ = x.shape
        M = centroids.shape[1]
        if M > N:
            raise ValueError(f"centroid attention maps N inputs to M <= N centroids, got M={M} > N={N}")
        if self.num_neighbors is not None and self.num_neighbors > N:
            raise ValueError(f"num_neighbors K={self.num_neighbors} exceeds the N={N} inputs: need K <= N")
        check_mask(mask, "mask", batch=B, length=N, device=x.device, like_name="x", nonempty="cloud")
        if neighbor_idx is not None:
            check_neighbor_idx(neighbor_idx, "neighbor_idx", B, M, N, x.device)
        if self.pos_enc is not None:
            P = self.pos_enc.fc1.in_features
            check_points(pos, "pos", channels=P)
            check_points(centroid_pos, "centroid_pos", channels=P)
            if pos.shape[:2] != x.shape[:2] or centroid_pos.shape[:2] != centroids.shape[:2]:
                raise ValueError(
                    f"pos must be (B, N, {P}) like x and centroid_pos (B, M, {P}) like centroids, got pos "
                    f"{tuple(pos.shape)} for x {tuple(x.shape)} and centroid_pos {tuple(centroid_pos.shape)} "
                    f"for centroids {tuple(centroids.shape)}"
                )

    def forward(
        self,
        x: Tensor,
        centroids: Tensor,
        mask: Tensor | None = None,
        neighbor_idx: Tensor | None = None,
        pos: Tensor | None = None,
        centroid_pos: Tensor | None = None,
    ) -> Tensor:
        if self.pos_encoding:
            if pos is None or centroid_pos is None:
                raise ValueError("pos_encoding=True needs pos (B, N, P) and centroid_pos (B, M, P)")
            if neighbor_idx is None and self.num_neighbors is None:
                raise ValueError("pos_encoding=True needs neighbours: set num_neighbors or pass neighbor_idx")
        if self.aggregation != "dot" and neighbor_idx is None and self.num_neighbors is None:
            raise ValueError(
                "aggregation='" + self.aggregation + "' needs neighbours: set num_neighbors or pass neighbor_idx"
            )
        if not torch.jit.is_scripting():  # nested: TorchScript skips the whole branch, condition included
            if self.validate_inputs and checks_active():
                self.check_inputs(x, centroids, mask, neighbor_idx, pos, centroid_pos)
        B, N, C = x.shape
        M = centroids.shape[1]
        H, D = self.num_heads, self.head_dim
        kv = self.kv(self.norm_kv(x))  # (B, N, 2 C)
        k, v = kv.view(B, N, 2, H, D).unbind(2)  # (B, N, H, D) each
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, D)
        dropout_p = self.attn_drop if self.training else 0.0
        u = centroids
        for _ in range(self.num_steps):
            idx = neighbor_idx
            if idx is None and self.num_neighbors is not None:
                idx = self._feature_neighbors(u, x, mask)  # (B, M, K)
            if self.aggregation != "dot" and idx is not None:
                out = self._edge_aggregation(u, kv, idx, pos, centroid_pos, mask, dropout_p)
                update = self.proj_drop(self.proj(out))
                u = u + self.drop_path(self.layer_scale(update))
                continue
            q = self.q(self.norm_q(u)).view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
            if self.pos_enc is not None and idx is not None and pos is not None and centroid_pos is not None:
                out = self._pos_attention(q, kv, idx, pos, centroid_pos, mask, dropout_p)
            elif idx is None:
                out = dense_centroid_attention(q, k, v, mask, self.normalize, dropout_p)
            else:
                out = self._knn_attention(q, k, v, idx, mask, dropout_p, neighbor_idx is not None)
            update = self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, M, C)))
            u = u + self.drop_path(self.layer_scale(update))
        return u

    @torch.jit.unused
    def _pos_attention(
        self, q: Tensor, kv: Tensor, idx: Tensor, pos: Tensor, centroid_pos: Tensor, mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:  # fmt: skip
        # Point Transformer's form with a dot product: logits q_i . (k_j + delta_ij), values v_j + delta_ij, where
        # delta_ij = fc2(act(fc1(p_j - p_i))). The chunked KNN path adds fc2's share per head from the hidden features
        # (knn_centroid_attention's pos_* arguments): no per-edge key, value or C-wide encoding is formed.
        B, H, M, D = q.shape
        N = kv.shape[1]
        k, v = kv.view(B, N, 2, H, D).unbind(2)
        enc = self.pos_enc
        hidden = enc.act(enc.fc1(gather(pos, idx) - centroid_pos.unsqueeze(2)))  # (B, M, K, R)
        return knn_centroid_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), idx, mask, self.normalize, dropout_p,
            pos_hidden=hidden, pos_weight=enc.fc2.weight, pos_bias=enc.fc2.bias,
        )  # fmt: skip

    @torch.jit.unused
    def _edges(
        self, u: Tensor, kv: Tensor, idx: Tensor, pos: Tensor | None, centroid_pos: Tensor | None
    ) -> tuple[Tensor | None, Tensor]:
        """Per-edge relations ``q_i - k_j + delta_ij`` (None for ``"max"``, which reads no query) and values
        ``v_j + delta_ij``, ``(B, M, K, C)`` each; delta is 0 without ``pos_encoding``."""
        C = self.dim
        kn, vn = gather(kv, idx).view(*idx.shape, 2, C).unbind(3)  # (B, M, K, C) each
        if self.pos_enc is not None and pos is not None and centroid_pos is not None:
            delta = self.pos_enc(gather(pos, idx) - centroid_pos.unsqueeze(2))  # (B, M, K, C)
            kn, vn = kn - delta, vn + delta
        if self.q is None:
            return None, vn
        return self.q(self.norm_q(u)).unsqueeze(2) - kn, vn

    @torch.jit.unused
    def _edge_aggregation(
        self, u: Tensor, kv: Tensor, idx: Tensor, pos: Tensor | None, centroid_pos: Tensor | None,
        mask: Tensor | None, dropout_p: float,
    ) -> Tensor:  # fmt: skip
        """The ``"vector"`` and ``"max"`` forms, ``(B, M, C)`` before the output projection. ``"vector"`` runs
        :func:`knn_vector_attention` (no per-edge C-wide tensor; :meth:`_edges` and :func:`grouped_vector_attention`
        are its per-edge reference)."""
        B, M, C = u.shape
        if self.weight_enc is not None and self.q is not None:
            fc1, act, fc2 = self.weight_enc
            k, v = kv.view(B, -1, 2, C).unbind(2)  # (B, N, C) each
            hidden, weight, bias = None, None, None
            if self.pos_enc is not None and pos is not None and centroid_pos is not None:
                enc = self.pos_enc
                hidden = enc.act(enc.fc1(gather(pos, idx) - centroid_pos.unsqueeze(2)))  # (B, M, K, R)
                weight, bias = enc.fc2.weight, enc.fc2.bias
            out = knn_vector_attention(
                self.q(self.norm_q(u)), k, v, idx, (fc1.weight, fc1.bias, lambda t: fc2(act(t))), mask,
                self.normalize, dropout_p, pos_hidden=hidden, pos_weight=weight, pos_bias=bias,
            )  # fmt: skip
            return out.transpose(1, 2).reshape(B, M, C)
        _, vn = self._edges(u, kv, idx, pos, centroid_pos)
        if mask is not None:
            vn = vn.masked_fill(~gather(mask, idx).unsqueeze(-1), float("-inf"))
        out = vn.amax(dim=2)  # (B, M, C)
        return out.masked_fill(out.isneginf(), 0.0)  # a centroid whose neighbours are all padding reads nothing

    @torch.jit.unused
    @torch.no_grad()
    def attention_weights(
        self,
        x: Tensor,
        centroids: Tensor,
        mask: Tensor | None = None,
        neighbor_idx: Tensor | None = None,
        pos: Tensor | None = None,
        centroid_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The first step's attention weights and the neighbours they cover, recomputed from the layer's own
        projections, for inspecting a trained layer (entropy, where the weights fall): ``(B, H, M, K)`` weights and
        ``(B, M, K)`` neighbour indices, or ``(B, H, M, N)`` and None for dense attention. Takes the arguments of
        :meth:`forward`; no dropout."""
        B, N, C = x.shape
        M = centroids.shape[1]
        H, D = self.num_heads, self.head_dim
        kv = self.kv(self.norm_kv(x))  # (B, N, 2 C)
        idx = neighbor_idx
        if idx is None and self.num_neighbors is not None:
            idx = self._feature_neighbors(centroids, x, mask)  # (B, M, K)
        if self.aggregation != "dot" and idx is not None:
            rel, vn = self._edges(centroids, kv, idx, pos, centroid_pos)
            if self.weight_enc is not None and rel is not None:
                logits = self.weight_enc(rel).permute(0, 3, 1, 2)  # (B, G, M, K)
                return _knn_weights(logits, idx, N, mask, self.normalize, 0.0, 1e-6), idx
            if mask is not None:
                vn = vn.masked_fill(~gather(mask, idx).unsqueeze(-1), float("-inf"))
            # "max": the share of each head's channels whose maximum a neighbour holds
            wins = F.one_hot(vn.view(B, M, -1, H, D).argmax(dim=2), idx.shape[-1]).to(vn.dtype)  # (B, M, H, D, K)
            return wins.mean(dim=3).permute(0, 2, 1, 3), idx
        q = self.q(self.norm_q(centroids)).view(B, M, H, D)
        if idx is None:
            k = kv.view(B, N, 2, H, D)[:, :, 0]
            scores = torch.einsum("bmhd,bnhd->bhmn", q, k) * D**-0.5  # (B, H, M, N)
            if mask is not None:
                scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
            dim = -1 if self.normalize == "inputs" else -2
            attn = scores.softmax(dim).nan_to_num(0.0)
            if self.normalize == "centroids":
                attn = attn / (attn.sum(-1, keepdim=True) + 1e-6)
            return attn, None
        K = idx.shape[-1]
        kn = gather(kv, idx).view(B, M, K, 2, H, D)[:, :, :, 0]  # (B, M, K, H, D)
        if self.pos_enc is not None and pos is not None and centroid_pos is not None:
            kn = kn + self.pos_enc(gather(pos, idx) - centroid_pos.unsqueeze(2)).view(B, M, K, H, D)
        scores = torch.einsum("bmhd,bmkhd->bhmk", q, kn) * D**-0.5  # (B, H, M, K)
        return _knn_weights(scores, idx, N, mask, self.normalize, 0.0, 1e-6), idx

    @torch.jit.unused
    def _feature_neighbors(self, u: Tensor, x: Tensor, mask: Tensor | None) -> Tensor:
        # forward checked the inputs (or was told they need no check), K <= N and the mask included
        return feature_neighbors(u, x, self.num_neighbors, mask, self.knn_backend, validate=False)

    @torch.jit.unused
    def _knn_attention(
        self, q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None, dropout_p: float, given: bool
    ) -> Tensor:
        # TorchScript cannot compile the chunked autograd Functions: a scripted KNN layer raises here.
        # The form is the switchboard's (op "knn_attention"): "auto" sizes it by N / K and the normalization. A KNN
        # search's neighbours never repeat; a given neighbor_idx is checked while the layer validates its inputs (once
        # per step, only where the masked form is asked for or would be taken), else taken at its word.
        distinct = True
        if given and self.validate_inputs and checks_active():
            distinct = _distinct_check(idx)
        shape = _knn_attention_shape(k.shape[2], idx.shape[-1], q.shape[-1], self.normalize, dropout_p, distinct)
        form = resolve("knn_attention", self.attn_backend, q.device, shape, q.dtype)
        if form == "masked":
            return masked_knn_attention(q, k, v, idx, mask, self.normalize, dropout_p)
        if form == "triton":
            return triton_knn_attention(q, k, v, idx, mask)
        return knn_centroid_attention(q, k, v, idx, mask, self.normalize, dropout_p)
