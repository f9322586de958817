"""What ``tools/bench_vision.py`` measures and the target it declares: Ours-1 against DeiT-tiny, images/s of the same
run (:func:`engine.bench.target`)."""

from __future__ import annotations

from collections.abc import Sequence

import timm
import torch

from engine.bench import target

__all__ = ["BASELINES", "OURS_1", "TARGETS", "ours_target", "registered", "width_of"]

BASELINES = {"tiny": "deit_tiny_patch16_224", "small": "deit_small_patch16_224"}
OURS_1 = "centroid_deit_tiny_c6_patch16_224"
# Ours-1's inference images/s over DeiT-tiny's: fp32 on CPU, bf16 autocast on CUDA (Token Merging's best DeiT-Ti
# result is 1.56x)
TARGETS = {"cpu": 1.4, "cuda": 1.6}


def registered() -> list[str]:
    """Every timm model that :mod:`vision` registers (timm files models under their module's last name)."""
    return sorted({n for module in ("centroid_deit", "baselines") for n in timm.list_models(module=module)})


def width_of(name: str) -> str:
    """``"small"`` or ``"tiny"``: the DeiT a model is compared with."""
    return "small" if "small" in name else "tiny"


def ours_target(results: Sequence[dict], device: torch.device | str) -> dict:
    """Ours-1's ``infer_vs_deit`` (images/s over DeiT-tiny's) against :data:`TARGETS` of the device type."""
    kind = torch.device(device).type
    want = TARGETS["cuda" if kind == "cuda" else "cpu"]
    row = next((r for r in results if r["model"] == OURS_1), None)
    name = f"Ours-1 inference images/s vs DeiT-tiny on {kind.upper()}"
    if row is None:
        return target(name, None, ">=", want, device=device, detail=f"{OURS_1} not in --models")
    return target(name, row["infer_vs_deit"], ">=", want, device=device)
