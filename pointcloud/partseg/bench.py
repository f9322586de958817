"""Throughput of the part-segmentation models (``tools/bench_partseg.py``): params, GMACs, train-step and inference
samples/s of the centroid model and the PointNet++ peer, every row measured in one run, as ratios to the peer.

Rows (:func:`plan`): every registered part-segmentation model at its own defaults (the ShapeNet Part configs'
models), and with ``main_job`` the centroid model at the main job's widths and K (``PartSegConfig``'s defaults, the
model of the CPU comparison on the synthetic parts), all on the same random batch of unit-sphere clouds with random
categories, 50 parts and 16 categories as in ShapeNet Part, with normals (``use_normals``: random unit vectors
after x, y, z, six input channels) as both ShapeNet Part configs and the main job feed them.

* train step: forward + per-point cross-entropy + backward + AdamW step, in train mode;
* inference: eval-mode forward under ``torch.no_grad``;
* all rows are built first, warmed up, then timed round-robin (:func:`measure.bench.time_round_robin`), so a change
  in background load hits all rows alike; samples/s = batch / the median (or fastest) round;
* ``train_vs_peer`` / ``infer_vs_peer``: samples/s over PointNet++'s in the same run;
* params and GMACs per sample, counted at batch 1 (matmuls; FPS, KNN and gathers cost time but no GMACs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from measure.bench import time_train_and_infer, unit_sphere_clouds
from measure.stats import count_gmacs, count_params

from ..bench import check_throughput_settings
from .model import create_model, list_models
from .recipe import MODEL_KNOBS, PartSegConfig

__all__ = ["CENTROID", "PEER", "benchmark", "check_settings", "main_job_kwargs", "plan", "prepare", "table"]

CENTROID = "centroid_transformer_partseg"
PEER = "pointnet2_ssg_partseg"
NUM_PARTS, NUM_CATEGORIES = 50, 16

Row = tuple[str, str, dict]  # (label, registered name, create_model kwargs)


def main_job_kwargs() -> dict:
    """The centroid model's keywords in the main job (the knobs and ``model_kwargs`` of ``PartSegConfig()``)."""
    cfg = PartSegConfig()
    knobs = {k: getattr(cfg, k) for k in MODEL_KNOBS if getattr(cfg, k) is not None}
    return {**knobs, **cfg.model_kwargs}


def plan(models: Sequence[str] | None = None, main_job: bool = True) -> list[Row]:
    """One row per model (default: every registered one), plus the centroid model at the main job's size."""
    rows: list[Row] = [(name, name, {}) for name in (models or list_models())]
    if main_job:
        rows.append((f"{CENTROID} (main job)", CENTROID, main_job_kwargs()))
    return rows


def _clouds(batch: int, num_points: int, normals: bool, seed: int = 0) -> torch.Tensor:
    """Unit-sphere clouds ``(B, N, 3)``, with random unit normals after x, y, z ``(B, N, 6)`` if ``normals``."""
    xyz = unit_sphere_clouds(batch, num_points, seed=seed)
    if not normals:
        return xyz
    n = torch.randn(batch, num_points, 3, generator=torch.Generator().manual_seed(seed + 1))
    return torch.cat([xyz, F.normalize(n, dim=-1)], dim=-1)


def prepare(
    name: str,
    kwargs: dict,
    device: torch.device | str,
    batch: int,
    num_points: int,
    amp: bool = False,
    use_normals: bool = True,
) -> tuple[dict, Callable[[], None], Callable[[], None]]:
    """Params and GMACs of one model, and its train-step and inference closures on ``batch`` clouds."""
    device = torch.device(device)
    torch.manual_seed(0)
    in_channels = 6 if use_normals else 3
    model = create_model(name, num_parts=NUM_PARTS, num_categories=NUM_CATEGORIES, in_channels=in_channels, **kwargs)
    model.to(device)
    one = torch.zeros(1, dtype=torch.long, device=device)
    stats = {"params_m": count_params(model) / 1e6,
             "gmacs": count_gmacs(model, _clouds(1, num_points, use_normals).to(device), one)}  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    points = _clouds(batch, num_points, use_normals, seed=1).to(device)  # (B, N, in_channels)
    category = torch.randint(0, NUM_CATEGORIES, (batch,), generator=gen).to(device)
    labels = torch.randint(0, NUM_PARTS, (batch, num_points), generator=gen).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

    def train_step() -> None:
        if not model.training:  # Module.train() walks every submodule: host time, not the step's
            model.train()
        with autocast:
            loss = F.cross_entropy(model(points, category).float().flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def infer() -> None:
        if model.training:
            model.eval()
        with torch.no_grad(), autocast:
            model(points, category)

    return stats, train_step, infer


def check_settings(models: Sequence[str], device: str, amp: bool, batch: int, repeats: int) -> None:
    """Raises ``ValueError`` for settings :func:`benchmark` cannot run, naming the fix."""
    check_throughput_settings(models, list_models(), device, amp, batch, repeats)


def benchmark(
    rows: Sequence[Row],
    device: str = "cpu",
    batch: int = 8,
    num_points: int = 2048,
    amp: bool = False,
    repeats: int = 3,
    warmup: int = 1,
    stat: str = "median",
    use_normals: bool = True,
) -> list[dict]:
    """Measures every row of :func:`plan`: one dict per row with its stats, ``{train,infer}_ms`` (and each round's
    ``_ms_rounds``), ``{train,infer}_sps`` and their ratios to the peer's in the same run (None without it)."""
    prepared = []
    for label, name, kwargs in rows:
        stats, train_step, infer = prepare(name, kwargs, device, batch, num_points, amp, use_normals)
        prepared.append(({"label": label, "model": name, "kwargs": kwargs, **stats}, train_step, infer))
    results = time_train_and_infer(prepared, device, batch, repeats, warmup, stat)
    peer = next((r for r in results if r["label"] == PEER), None)
    for r in results:
        for key in ("train", "infer"):
            r[f"{key}_vs_peer"] = r[f"{key}_sps"] / peer[f"{key}_sps"] if peer else None
    return results


def table(results: Sequence[dict]) -> tuple[list[str], list[list]]:
    """The printed table's headers and rows (``"-"`` where a ratio has no peer row)."""

    def cell(v: float | None) -> object:
        return "-" if v is None else v

    headers = ["model", "params (M)", "GMACs", "train samples/s", "train vs PointNet++", "infer samples/s",
               "infer vs PointNet++"]  # fmt: skip
    rows = [[r["label"], r["params_m"], r["gmacs"], r["train_sps"], cell(r["train_vs_peer"]), r["infer_sps"],
             cell(r["infer_vs_peer"])] for r in results]  # fmt: skip
    return headers, rows
