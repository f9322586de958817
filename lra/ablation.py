"""The FSAT ablation (Zhuang et al., ACL 2022, Table 3) and the matrix mixer framework's SAM table (Hwang et al.,
arXiv:2407.09941) on ListOps in one medium-length regime: ``tools/run_ablation.py --table fsat`` / ``--table sam``.

**Regime** (:data:`REGIME`, on top of each row's ``configs/lra/`` file, which sets the mixer, its switches and the
FFN ratio): expressions of 128-256 tokens from LRA's grammar (max depth 10, up to 10 arguments), padded to 256;
4,000 training and 1,000 test expressions (and 500 validation ones, unused), drawn once (data seed 0) and written in
LRA's TSV format, which every row and seed then reads (``data_root``): the seeds vary the initialization and the data
order, never the data. 4 epochs of batch 32 (500 steps), AdamW at 2e-3 decayed linearly to 10%, no warm-up, no
dropout, float32.

**Why 256 tokens**: FSAT's sparsity has to matter, and it does only when a query's edges are a small part of the
sequence: a key sends M predicted edges (M = 4 by default, plus M random ones in training), so a query receives about
2M = 8 in training and M in inference, 3% of 256 positions (12% at the main job's 64 tokens, where the attention is
close to dense). Longer sequences cost more than a run's budget of about 5 minutes on a 2-core CPU (per-step times
at 256 and 512 tokens: docs/ablations.md). The chunked Cauchy and Vandermonde products do
O(L^2 D) work on a CPU (their fast path is a GPU kernel): those rows and their twins take many times longer.
"""

from __future__ import annotations

from pathlib import Path

from engine.ablation import Row, Table, register_table

from .data import LRA_FILES, generate_listops, write_listops_tsv
from .recipe import ListOpsRecipe

__all__ = ["DATA", "FSAT_TABLE", "REGIME", "SAM_CLASSES", "SAM_TABLE", "prepare_data"]

DATA = {"train_size": 4000, "val_size": 500, "test_size": 1000, "min_length": 128, "max_length": 256,
        "max_depth": 10, "max_args": 10, "seed": 0}  # fmt: skip
REGIME = (
    f"train_size={DATA['train_size']}",
    f"test_size={DATA['test_size']}",
    f"min_length={DATA['min_length']}",
    f"max_length={DATA['max_length']}",
    f"max_depth={DATA['max_depth']}",
    f"max_args={DATA['max_args']}",
    "seq_len=256",
    "epochs=4",
    "batch_size=32",
    "eval_batch_size=128",
    "lr=0.002",
    "warmup_epochs=0",
    "drop=0.0",
    "amp=false",
)


def prepare_data(out_dir: Path) -> tuple[str, ...]:
    """Writes the regime's expressions as LRA's ``basic_{train,val,test}.tsv`` under ``out_dir/data`` (once); returns
    the ``data_root`` item that points every row at them."""
    folder = Path(out_dir) / "data" / "listops_{min_length}_{max_length}".format(**DATA)
    if not all((folder / f).is_file() for f in LRA_FILES.values()):
        folder.mkdir(parents=True, exist_ok=True)
        kw = {k: DATA[k] for k in ("min_length", "max_length", "max_depth", "max_args")}
        # the recipe's convention for generated data: train from the seed, test from seed + 10000 (val: + 20000)
        splits = (("train", "train_size", 0), ("test", "test_size", 10_000), ("val", "val_size", 20_000))
        for split, size, offset in splits:
            write_listops_tsv(folder / LRA_FILES[split], generate_listops(DATA[size], DATA["seed"] + offset, **kw))
    return (f"data_root={folder}",)


def _table(name: str, title: str, rows: tuple[Row, ...], about: str) -> Table:
    table = Table(name=name, title=title, recipe=ListOpsRecipe, tool="tools/lra_listops.py", metric="test_acc",
                  rows=rows, regime=REGIME, prepare=prepare_data, description=about)  # fmt: skip
    return register_table(table)


_REGIME_TEXT = (
    "ListOps, 128-256 tokens padded to 256, 4,000 train / 1,000 test expressions written once in LRA's TSV format, "
    "4 epochs of batch 32, AdamW 2e-3 with linear decay, width 64, 2 blocks, 4 heads (`lra/ablation.py`). "
    "Test accuracy (%) after the last epoch; std over seeds (n - 1)."
)

FSAT_TABLE = _table(
    "fsat",
    "FSAT ablation (FSAT paper, Table 3) on ListOps, 128-256 tokens",
    (
        Row("softmax (baseline)", "configs/lra/listops_softmax.yaml"),
        Row("FSAT-2", "configs/lra/listops_fsat_2.yaml"),
        Row("FSAT-4", "configs/lra/listops_fsat.yaml"),
        Row("FSAT-8", "configs/lra/listops_fsat_8.yaml"),
        Row("FSAT-No Trunc.", "configs/lra/listops_fsat_no_trunc.yaml"),
        Row("FSAT-Only Ir", "configs/lra/listops_fsat_only_ir.yaml"),
        Row("FSAT-Only Ip", "configs/lra/listops_fsat_only_ip.yaml"),
        Row("FSAT+DConv-5", "configs/lra/listops_fsat_dconv5.yaml"),
        Row("FAT", "configs/lra/listops_fat.yaml"),
    ),
    _REGIME_TEXT + " FSAT rows halve the FFN (mlp_ratio 1.0 against 2.0), as the paper does.",
)

# Each structured class with its non-data-dependent twin, then the two mixers that have only the fixed form.
SAM_CLASSES = ("softmax", "linear", "lowrank", "toeplitz", "cauchy", "vandermonde", "quasiseparable", "hydra")
SAM_TABLE = _table(
    "sam",
    "Matrix mixers with and without data dependence (SAM) on ListOps, 128-256 tokens",
    (
        *(
            row
            for name in SAM_CLASSES
            for row in (
                Row(name, f"configs/lra/listops_{name}.yaml"),
                Row(f"{name}_static", f"configs/lra/listops_{name}_static.yaml"),
            )
        ),
        Row("dense", "configs/lra/listops_dense.yaml"),
        Row("dft", "configs/lra/listops_dft.yaml"),
    ),
    _REGIME_TEXT + " `<name>_static`: the same matrix class with q, k (and gates) learned per position.",
)
