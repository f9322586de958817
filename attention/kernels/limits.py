"""What each kernel supports, importable without triton or numba.

The kernels import their limits from here, and :mod:`attention.backends` declares them in its entries, so the
switchboard knows a kernel's shapes without importing the kernel's package.
"""

from __future__ import annotations

__all__ = [
    "FPS_TRITON_MAX_CHANNELS",
    "FPS_TRITON_MAX_POINTS",
    "FSAT_TRITON_MAX_HEAD_DIM",
    "KNN_ATTN_TRITON_MAX_HEAD_DIM",
    "KNN_TRITON_MAX_NEIGHBORS",
    "MIX_TRITON_MAX_HEAD_DIM",
    "SSD_TRITON_CHUNK",
    "SSD_TRITON_MAX_DIM",
]

# attention/kernels/fps_triton.py: one program holds next_pow2(N) distances; beyond this the registers spill and the
# torch loop is the better choice.
FPS_TRITON_MAX_POINTS = 1 << 16
# Its channel loop is unrolled at compile time (one kernel per C): beyond a few channels (FPS in feature space) the
# torch loop is used instead of compiling large kernels.
FPS_TRITON_MAX_CHANNELS = 8

# attention/kernels/mixers_triton.py: the backward tiles hold BLOCK_M * BLOCK_N * next_pow2(D) values (BLOCK_M,
# BLOCK_N >= 16 for tl.dot): beyond D = 64 they spill out of registers even with 16 warps, and so do the (BLOCK, Dv)
# operands beyond Dv = 64 (ptxas for sm_90). Larger heads (D or Dv) take the chunked PyTorch path.
MIX_TRITON_MAX_HEAD_DIM = 64

# attention/kernels/knn_attention_triton.py: a program holds one (BLOCK_K, BLOCK_H * next_pow2(D)) tile of keys and one
# of values (BLOCK_K shrinks as the heads' width grows, to 4096 values a tile); beyond D = 128 one head's BLOCK_K would
# fall below 32 neighbours a step. Several heads a program (block_h) trade neighbours a step for heads the same way.
KNN_ATTN_TRITON_MAX_HEAD_DIM = 128

# attention/kernels/knn_triton.py: a program keeps a sorted (BLOCK_M, next_pow2(k)) list of the nearest points so far
# in registers and merges every tile of next_pow2(k) candidates into it with a bitonic sort and merge; beyond 64
# neighbours the sorts dominate and the chunked reference is used.
KNN_TRITON_MAX_NEIGHBORS = 64

# attention/kernels/fsat_triton.py: its tiles are (rows, next_pow2(D)) with rows = 512 / next_pow2(D), so registers do
# not grow with D; past D = 128 a program would hold fewer than 4 rows, and the gathered loads in flight thin out.
# Larger heads take the torch paths.
FSAT_TRITON_MAX_HEAD_DIM = 128

# attention/kernels/ssd_triton.py: the chunk kernels hold (T, N), (T, Dv), (T, T) and (N, Dv) tiles; the backward
# kernel holds about a dozen of them, which past 64 (state size N or head dim Dv) spill out of registers (ptxas,
# sm_90). Larger states or heads take the chunked PyTorch scan.
SSD_TRITON_MAX_DIM = 64
# Its default chunk length T (scan_blocks there says why 16); the operators' shape functions read it without triton.
SSD_TRITON_CHUNK = 16
