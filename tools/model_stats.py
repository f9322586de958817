"""Parameters and GMACs of every registered model, next to the papers' numbers.

    python tools/model_stats.py                                   # every family that has models
    python tools/model_stats.py --family pointcloud --points 2048
    python tools/model_stats.py --models centroid_transformer_modelnet40 --json stats.json
    python tools/model_stats.py --check                           # CI: exit 1 if a checked model is off the paper

One Markdown table per family; each row is a registered model, so a model appears here as soon as its package
registers it, and a paper number whose model is not registered yet is not printed. ``ratio`` = ours / paper.
Families (see ``FAMILIES``):

* ``pointcloud``: ``pointcloud.list_models()`` on one cloud of ``--points`` xyz points (default 1024), 40 classes.
  Paper: the centroid transformer 4.1 M params, 5.4 GMACs (section 3.2; no separate numbers for the ablation
  twins); peers DGCNN 1.8 M and PointNet++ (SSG) 1.5 M params (their GMACs are not given).
  Two GMAC columns: ours (keys and values projected once per point, then gathered per neighbour) and "per-edge k/v",
  the same forward pass with KNN attention's key/value projections evaluated per (centroid, neighbour) edge
  (:func:`edge_projection`, a module swap defined here; outputs tested equal). The paper's 5.4 GMACs cannot come from
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

import argparse
import contextlib
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

import torch
from torch import Tensor, nn

from attention import CentroidAttention, edge_attention, gather
from engine import atomic_write_text, count_gmacs, count_params
from engine.bench import describe_machine, print_table, unit_sphere_clouds

# --------------------------------------------------------------------------------------------------------------------
# Per-edge evaluation of KNN centroid attention (MAC accounting only)
# --------------------------------------------------------------------------------------------------------------------


class EdgeProjectionAttention(CentroidAttention):
    """:class:`attention.CentroidAttention` with its key and value projections evaluated per (centroid, neighbour)
    edge: the normalized inputs are gathered ``(B, M, K, C)`` and then projected, instead of projecting the N inputs
    once and gathering keys and values. Same function up to rounding (tested, outputs and gradients); K times the
    key/value projection MACs. It exists so that the MAC count can be set next to KNN attention code that projects
    per edge (the paper's); never train with it. The dense path (no neighbours) is the parent's.
    """

    def forward(
        self, x: Tensor, centroids: Tensor, mask: Tensor | None = None, neighbor_idx: Tensor | None = None
    ) -> Tensor:
        if neighbor_idx is None and self.num_neighbors is None:
            return super().forward(x, centroids, mask, neighbor_idx)
        self.check_inputs(x, centroids, mask, neighbor_idx)
        B, N, C = x.shape
        M = centroids.shape[1]
        H, D = self.num_heads, self.head_dim
        xn = self.norm_kv(x)
        dropout_p = self.attn_drop if self.training else 0.0
        u = centroids
        for _ in range(self.num_steps):
            q = self.q(self.norm_q(u)).view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
            idx = neighbor_idx if neighbor_idx is not None else self._feature_neighbors(u, x, mask)  # (B, M, K)
            kn, vn = self.kv(gather(xn, idx)).view(B, M, -1, 2, H, D).unbind(3)  # (B, M, K, H, D) each
            out = edge_attention(q, kn, vn, idx, N, mask=mask, normalize=self.normalize, dropout_p=dropout_p, eps=1e-6)
            u = u + self.drop_path(self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, M, C))))
        return u


@contextlib.contextmanager
def edge_projection(model: nn.Module) -> Iterator[nn.Module]:
    """Swaps every :class:`attention.CentroidAttention` of ``model`` for :class:`EdgeProjectionAttention` (same
    parameters, same module objects) inside the context, and back on exit."""
    swapped = [m for m in model.modules() if type(m) is CentroidAttention]
    for m in swapped:
        m.__class__ = EdgeProjectionAttention
    try:
        yield model
    finally:
        for m in swapped:
            m.__class__ = CentroidAttention


@dataclass(frozen=True)
class Family:
    """How to measure the models of one package.

    Attributes:
        list_models: registered model names; an empty list skips the family with ``note``.
        build: builds a model by name (default settings, eval-ready).
        example_input: one batch-1 input for a model, from the parsed command line.
        describe: the input, for the table's heading.
        paper: model name -> (params in M, GMACs), either ``None`` where the paper gives none.
        checks: model name -> (relative params tolerance, relative GMACs tolerance) for ``--check``.
        edge_gmacs: also count GMACs with KNN attention's key/value projections evaluated per edge
            (:func:`edge_projection`), and compare that count with the paper's (see the module docstring).
        note: why the family may have no models.
    """

    list_models: Callable[[], list[str]]
    build: Callable[[str], nn.Module]
    example_input: Callable[[argparse.Namespace], torch.Tensor]
    describe: Callable[[argparse.Namespace], str]
    paper: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)
    edge_gmacs: bool = False
    note: str = ""


# --------------------------------------------------------------------------------------------------------------------
# pointcloud
# --------------------------------------------------------------------------------------------------------------------


def _pointcloud_models() -> list[str]:
    return importlib.import_module("pointcloud").list_models()


def _pointcloud_build(name: str) -> nn.Module:
    return importlib.import_module("pointcloud").create_model(name, num_classes=40)


def _cloud(num_points: int) -> torch.Tensor:
    return unit_sphere_clouds(1, num_points)  # (B, N, 3)


# --------------------------------------------------------------------------------------------------------------------
# capsules: a tiny registry of the pointcloud shape (create_model / list_models), once the package has models
# --------------------------------------------------------------------------------------------------------------------


def _capsules_models() -> list[str]:
    list_fn = getattr(importlib.import_module("capsules"), "list_models", None)
    return list(list_fn()) if list_fn else []


def _capsules_build(name: str) -> nn.Module:
    # The paper's architecture: the reference code's decoder (the default patch decoder has 0.07 M parameters, not 4.8)
    return importlib.import_module("capsules").create_model(name, decoder="heads")


# --------------------------------------------------------------------------------------------------------------------
# vision: timm models registered by `import vision`, with timm's own DeiTs as the paper's references
# --------------------------------------------------------------------------------------------------------------------

_VISION_REFERENCES = ["deit_tiny_patch16_224", "deit_small_patch16_224"]


def _vision_models() -> list[str]:
    vision = importlib.import_module("vision")
    if not any(pkgutil.iter_modules(vision.__path__)):
        return []  # placeholder package: do not pay for (or depend on) importing timm
    timm = importlib.import_module("timm")
    ours = [n for n in timm.list_models() if timm.models.model_entrypoint(n).__module__.startswith("vision.")]
    return [*ours, *_VISION_REFERENCES] if ours else []


def _vision_build(name: str) -> nn.Module:
    importlib.import_module("vision")
    return importlib.import_module("timm").create_model(name, pretrained=False)


FAMILIES: dict[str, Family] = {
    "pointcloud": Family(
        list_models=_pointcloud_models,
        build=_pointcloud_build,
        example_input=lambda args: _cloud(args.points or 1024),
        describe=lambda args: f"one cloud of {args.points or 1024} points (xyz), 40 classes",
        paper={
            "centroid_transformer_modelnet40": (4.1, 5.4),
            "dgcnn_modelnet40": (1.8, None),
            "pointnet2_ssg_modelnet40": (1.5, None),
        },
        checks={"centroid_transformer_modelnet40": (0.15, 0.25)},
        edge_gmacs=True,
    ),
    # Paper (section 3.3, 12 / 64 latent capsules): dynamic routing 18.4 / 19.8 M params, centroid 0.6 / 5.3 M; no
    # GMACs. Only routing small follows from the reference architecture (see the module docstring), so it is checked.
    "capsules": Family(
        list_models=_capsules_models,
        build=_capsules_build,
        example_input=lambda args: _cloud(args.points or 2048),
        describe=lambda args: f"one cloud of {args.points or 2048} points (xyz), 2048 reconstructed points",
        paper={
            "pointcaps_routing_small": (18.4, None),
            "pointcaps_centroid_small": (0.6, None),
            "pointcaps_routing_base": (19.8, None),
            "pointcaps_centroid_base": (5.3, None),
        },
        checks={"pointcaps_routing_small": (0.05, 1.0)},
        note="capsules/ registers no models yet (it has no list_models)",
    ),
    # Paper (section 3.4), Ours-1..6 (M params / GMACs), keyed by the names vision/centroid_deit.py registers.
    "vision": Family(
        list_models=_vision_models,
        build=_vision_build,
        example_input=lambda args: torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),
        describe=lambda args: "one 224 x 224 RGB image, 1000 classes",
        paper={
            "deit_tiny_patch16_224": (5.7, 1.3),
            "deit_small_patch16_224": (22.1, 4.7),
            "centroid_deit_tiny_c6_patch16_224": (5.7, 0.8),  # Ours-1
            "centroid_deit_tiny_c5_overlap_patch16_224": (5.7, 1.0),  # Ours-2
            "centroid_deit_tiny_c7_overlap_patch16_224": (5.8, 1.3),  # Ours-3
            "centroid_deit_small_c6_patch16_224": (22.1, 2.9),  # Ours-4
            "centroid_deit_small_c5_overlap_patch16_224": (22.1, 3.6),  # Ours-5
            "centroid_deit_small_c7_overlap_patch16_224": (22.3, 4.7),  # Ours-6
            "settrans_deit_tiny_patch16_224": (5.9, 1.1),
            "settrans_deit_small_patch16_224": (22.4, 3.8),
            "linformer_deit_tiny_patch16_224": (6.3, 1.2),
            "linformer_deit_small_patch16_224": (22.6, 4.4),
        },
        note="vision/ registers no timm models yet (the package has no modules)",
    ),
}


def _ratio(ours: float | None, paper: float | None) -> float | None:
    return ours / paper if ours is not None and paper else None


def measure(family: str, name: str, args: argparse.Namespace) -> dict:
    """Params (M) and GMACs of one model, with the paper's numbers and the ratios ours / paper."""
    fam = FAMILIES[family]
    paper_params, paper_gmacs = fam.paper.get(name, (None, None))
    row: dict = {"family": family, "model": name, "params_m": None, "gmacs": None}
    try:
        torch.manual_seed(0)
        model = fam.build(name)
        x = fam.example_input(args)
        row["input"] = list(x.shape)
        row["params_m"] = count_params(model) / 1e6
        row["gmacs"] = count_gmacs(model, x)
        if fam.edge_gmacs:
            with edge_projection(model):
                row["gmacs_edge"] = count_gmacs(model, x)
    except Exception as e:  # one broken (e.g. just-registered) model must not hide the others
        row["error"] = f"{type(e).__name__}: {e}"
    compared = row.get("gmacs_edge") if fam.edge_gmacs else row["gmacs"]
    row.update(
        paper_params_m=paper_params,
        params_ratio=_ratio(row["params_m"], paper_params),
        paper_gmacs=paper_gmacs,
        gmacs_ratio=_ratio(compared, paper_gmacs),
    )
    return row


def check(results: list[dict]) -> list[str]:
    """Failures of ``--check``: models in a family's ``checks`` whose numbers are off the paper's tolerance."""
    failures = []
    for r in results:
        tols = FAMILIES[r["family"]].checks.get(r["model"])
        if tols is None:
            continue
        if "error" in r:
            failures.append(f"{r['model']}: could not be measured ({r['error']})")
            continue
        edge = FAMILIES[r["family"]].edge_gmacs
        gmacs = ("GMACs (per-edge k/v)", "gmacs_edge") if edge else ("GMACs", "gmacs")
        for label, key, unit, tol in (("params", "params_m", " M", tols[0]), (*gmacs, "", tols[1])):
            ours, paper = r[key], r["paper_gmacs" if key.startswith("gmacs") else f"paper_{key}"]
            if paper is None:
                continue
            lo, hi = paper * (1 - tol), paper * (1 + tol)
            if not lo <= ours <= hi:
                failures.append(
                    f"{r['model']}: {label} measured {ours:.3f}{unit}, expected the paper's {paper}{unit} +-{tol:.0%} "
                    f"= [{lo:.3f}, {hi:.3f}] (ratio {ours / paper:.3f})"
                )
    return failures


def _fmt(v: float | None) -> object:
    return "-" if v is None else v


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="all", choices=[*FAMILIES, "all"])
    parser.add_argument("--points", type=int, default=None, help="points per cloud (default: 1024; capsules 2048)")
    parser.add_argument("--models", nargs="+", default=None, help="only these registered names")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked model is outside the tolerance")
    args = parser.parse_args(argv)
    if args.check and args.points not in (None, 1024):
        parser.error("--check compares with the paper's numbers at 1024 points: drop --points")

    registered = {f: FAMILIES[f].list_models() for f in (FAMILIES if args.family == "all" else [args.family])}
    if args.models is not None:
        unknown = sorted(set(args.models) - {n for names in registered.values() for n in names})
        if unknown:
            parser.error(f"unknown models {unknown}; registered: {[n for names in registered.values() for n in names]}")
    checked = [n for f in registered for n in FAMILIES[f].checks if n in registered[f]]
    if args.check and args.models is not None and not set(checked) <= set(args.models):
        parser.error(f"--check needs {checked} measured: keep them in --models")

    print(f"# model_stats: {describe_machine('cpu')}")
    print("# GMACs per sample by torch.utils.flop_counter (matmuls incl. attention; not element-wise, gather/scatter)")
    results: list[dict] = []
    for family, names in registered.items():
        fam = FAMILIES[family]
        if not names:
            print(f"\n## {family}: skipped, {fam.note or 'no registered models'}")
            continue
        names = [n for n in names if args.models is None or n in args.models]
        if not names:
            continue
        rows = [measure(family, n, args) for n in names]
        results += rows
        print(f"\n## {family}: {fam.describe(args)}\n")
        edge = fam.edge_gmacs
        print_table(
            ["model", "params (M)", "paper params (M)", "ratio", "GMACs", *["GMACs per-edge k/v"][:edge],
             "paper GMACs", "ratio"],
            [
                [r["model"], _fmt(r["params_m"]), _fmt(r["paper_params_m"]), _fmt(r["params_ratio"]),
                 _fmt(r["gmacs"]), *[_fmt(r.get("gmacs_edge"))][:edge], _fmt(r["paper_gmacs"]), _fmt(r["gmacs_ratio"])]
                for r in rows
            ],
        )  # fmt: skip
        for r in rows:
            if "error" in r:
                print(f"\nerror: {r['model']}: {r['error']}")
    if args.json:
        payload = {"tool": "model_stats", "machine": describe_machine("cpu"), "results": results}
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
    if args.check:
        failures = check(results)
        if failures:
            raise SystemExit("model_stats --check FAILED:\n  " + "\n  ".join(failures))
        print(f"\ncheck: ok ({', '.join(checked) or 'no checked model registered'})")
    return results


if __name__ == "__main__":
    sys.exit(1 if any("error" in r for r in main()) else 0)
