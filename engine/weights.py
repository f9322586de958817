"""Exported weights: ``model.safetensors`` files that carry a digest of their tensors, checked whenever one is read.

safetensors stores no checksum of its data, so a flipped byte or a NaN weight would load without a word and shift
the model's outputs. :func:`save_weights` writes the sha256 of the tensors (:func:`weights_digest`) into the file's
metadata under :data:`DIGEST_KEY`; :func:`load_weights` recomputes it and refuses a file whose tensors differ from
what was written, or that holds a NaN or an infinite floating-point value. A file without a digest (written by an
older export or by another tool) is read with a logged warning, its non-finite values still refused.

Every reader of an export goes through :func:`load_weights`: :func:`engine.export.load_exported` and the registries'
``create_model(name, checkpoint=...)`` (:class:`engine.registry.ModelRegistry`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from measure.atomic import atomic_open

__all__ = ["DIGEST_KEY", "load_weights", "nonfinite_weights", "save_weights", "weights_digest"]

logger = logging.getLogger(__name__)

#: The metadata key of the tensors' digest in a ``model.safetensors`` the toolkit writes.
DIGEST_KEY = "weights_sha256"


def weights_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """The sha256 (hex) of ``tensors``: in name order, for each a line ``name<TAB>dtype<TAB>shape`` and then its bytes
    in C order, as safetensors stores them (little-endian). Independent of the file's layout, so the same tensors
    read back give the same digest."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\t{str(t.dtype).removeprefix('torch.')}\t{list(t.shape)}\n".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def nonfinite_weights(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The floating-point tensors of ``tensors`` that hold NaN or infinite values, with their counts, for a message
    (``"head.weight: 1 of 400"``; the first three, then how many more), or None when every value is finite."""
    counts = {}
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                counts[name] = bad
    if not counts:
        return None
    shown = ", ".join(f"{name}: {n} of {tensors[name].numel()}" for name, n in list(counts.items())[:3])
    return shown + (f" and {len(counts) - 3} more tensors" if len(counts) > 3 else "")


def save_weights(tensors: Mapping[str, torch.Tensor], path: str | Path, metadata: Mapping[str, str]) -> None:
    """Writes ``tensors`` to ``path`` as safetensors (atomically), with ``metadata`` and the tensors' digest.

    Raises:
        ValueError: a tensor holds NaN or infinite values (the message names them).
    """
    from safetensors.torch import save

    bad = nonfinite_weights(tensors)
    if bad:
        raise ValueError(f"refusing to write {path}: non-finite weights (NaN or inf; {bad})")
    data = save(dict(tensors), metadata={**metadata, DIGEST_KEY: weights_digest(tensors)})
    with atomic_open(path, "wb") as f:
        f.write(data)


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, checked: its digest (when it has one) and every value finite.

    Raises:
        ValueError: the file cannot be read as safetensors, its tensors do not match the digest it records (damaged
            since it was written), or it holds NaN or infinite values; each message names the file.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as e:
        raise ValueError(
            f"{path} cannot be read as safetensors ({e}): expected a file tools/export_weights.py wrote"
        ) from e
    expected = metadata.get(DIGEST_KEY)
    if expected is None:
        logger.warning("%s records no %s: its bytes cannot be checked (export it again to add one)", path,
                       DIGEST_KEY)  # fmt: skip
    else:
        found = weights_digest(tensors)
        if found != expected:
            raise ValueError(
                f"{path} is damaged: its tensors' sha256 is {found[:16]}..., not the {expected[:16]}... it was "
                "written with; export the checkpoint again"
            )
    bad = nonfinite_weights(tensors)
    if bad:
        raise ValueError(
            f"{path} holds non-finite weights (NaN or inf; {bad}): a model loaded from it computes NaN; export a "
            "checkpoint with finite weights"
        )
    return tensors
