"""Measurement, the toolkit's ground floor: timing, memory, op and FLOP counts, profiles, and the reports they make.

The core's benches (:mod:`attention.bench`), the domain benches and the training harness (:mod:`engine`) all measure
with these modules, so they live below every other package: ``measure`` imports only the standard library, torch and
numpy (optional packages lazily, inside the function that needs them), and nothing of the toolkit but itself.

* :mod:`measure.bench`: timing (round-robin, train and inference, CUDA-graph capture), peak memory (tensors, the
  resident set in a fresh process), aten-op counts, ``torch.profiler`` summaries, tables, targets and the ``--json``
  report of every ``tools/bench_*.py``.
* :mod:`measure.report`: those reports rendered into docs/benchmarks.md (``tools/docs_benchmarks.py``).
* :mod:`measure.stats`: parameter counts and GMACs, and the model-statistics table against the papers' figures
  (``tools/model_stats.py``).
* :mod:`measure.gpu_check`: every CUDA path checked and benchmarked in one folder of tables (``tools/gpu_check.py``).
* :mod:`measure.atomic`: atomic file writes (temporary file + ``os.replace``), for reports and the harness's run files.

Nothing is imported here, so that ``measure.gpu_check`` and ``measure.atomic`` load without torch.
"""
