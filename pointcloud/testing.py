"""Helpers shared by the point-cloud tests (like ``torch_geometric.testing``, a module of the package): a tiny run's
``--set`` values, the registry sweep's checks and a model small enough to count by hand. Nothing in the library
imports this module."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.testing import assert_close

from attention import LayerScale

from .model import create_model

__all__ = ["TINY_MODELNET_SETS", "TINY_PARTSEG_SETS", "TinyPeer", "check_model_sweep", "check_registered_model"]

# A 32-point centroid transformer (16 then 8 centroids, K = 4) on 4 synthetic classes x 4 shapes: the ``--set``
# values of the train_modelnet tests. Peer models take the same items without num_centroids and fuse_dim.
TINY_MODELNET_SETS = (
    "num_points=32",
    "num_centroids=[16,8]",
    "num_neighbors=4",
    "fuse_dim=32",
    "synthetic_classes=4",
    "synthetic_train_per_class=4",
    "synthetic_test_per_class=2",
    "batch_size=8",
    "eval_batch_size=8",
)


# A 32-point part-segmentation run (centroid model: 16 then 8 centroids, K = 4, narrow widths) on 2 synthetic
# categories (table, mug: 4 parts) x 4 shapes: the ``--set`` values of the train_partseg tests.
TINY_PARTSEG_SETS = (
    "num_points=32",
    "num_centroids=[16,8]",
    "num_neighbors=4",
    "fuse_dim=32",
    "model_kwargs={widths: [16, 32, 32, 32], global_dim: 16, head_dims: [16]}",
    "synthetic_classes=[table,mug]",
    "synthetic_train_per_class=4",
    "synthetic_test_per_class=2",
    "batch_size=4",
    "eval_batch_size=4",
)


class TinyPeer(nn.Module):
    """A per-point linear layer and a max pool: 3 * 40 + 40 = 160 params, N * 3 * 40 MACs.

    Shapes:
        points: ``(B, N, 3)``; output: ``(B, num_classes)``.
    """

    def __init__(self, num_classes: int = 40) -> None:
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.fc(points).amax(1)


def check_registered_model(name: str, **kwargs: object) -> None:
    """The registry sweep for one model built by ``create_model(name, **kwargs)``: finite ``(2, 40)`` logits from two
    clouds of 128 points, a non-zero gradient for every parameter, and the same eval output from a second model that
    loads its state dict."""
    check_model_sweep(create_model, name, kwargs, (torch.rand(2, 128, 3),), (2, 40))


def check_model_sweep(
    create: Callable[..., nn.Module], name: str, kwargs: dict, inputs: tuple, shape: tuple[int, ...]
) -> None:
    """The registry sweep of any point model family: ``create(name, **kwargs)`` gives finite logits of ``shape`` on
    ``inputs``, a non-zero gradient for every parameter (of their log-sum-exp), and a second model that loads its
    state dict gives the same eval output.

    A :class:`attention.LayerScale` initialised to 0 passes no gradient to the branch it gates until its own gradient
    has moved it (ReZero's design): such a gate must get a gradient itself, and the check for every other parameter
    runs with the gates opened (set to 0.1)."""
    model = create(name, **kwargs)
    logits = model(*inputs)
    assert logits.shape == shape and bool(torch.isfinite(logits).all())
    logits.logsumexp(-1).sum().backward()
    gates = [m.gamma for m in model.modules() if isinstance(m, LayerScale) and not bool(m.gamma.any())]
    shut = [g for g in gates if g.grad is None or not bool(g.grad.abs().sum() > 0)]
    assert not shut, f"{name}: {len(shut)} of its zero LayerScale gates get no gradient"
    if gates:
        with torch.no_grad():
            for g in gates:
                g.fill_(0.1)
        model.zero_grad()
        model(*inputs).logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not missing, f"{name}: no gradient for {missing}"
    model.eval()
    clone = create(name, **kwargs).eval()
    clone.load_state_dict(model.state_dict())
    assert_close(clone(*inputs), model(*inputs))
