"""thinking-seeds analysis: reads runs written by ``trainer``, writes tables to ``results/analysis/``.

- ``tsanalysis.core``: pure estimators (numpy/pandas, no file IO): per-position bins, truncation-token
  histograms, Lemma 4 zero-advantage probabilities, seed-token mismatch, the seeds' restart values, pass@k with
  bootstrap intervals.
- ``tsanalysis.io``: streaming rollout reads (via ``contracts.records``) and the atomic results writer.
- ``tsanalysis.tables``: the analyses of a run as functions returning DataFrames (positions, truncation,
  zero-advantage, Lemma 4, mismatch, seeds): what the commands write and ``figures`` caches.
- ``tsanalysis.config``: ``RelayConfig`` and ``SupportConfig``, the validated configs of the two commands below.
- ``tsanalysis.relay``: relay inference (an early checkpoint writes a prefix, the final one continues):
  ``run_relay(cfg)``.
- ``tsanalysis.support``: support dynamics of checkpoints scored by ``eval.run`` (gained / lost / kept per k,
  crossover k, distinct answers, answer entropy, cross-model likelihood): ``support_tables(cfg)``.
- ``tsanalysis.errors``: ``UsageError`` and ``RelayError`` (bad input, raised before expensive work).
- ``tsanalysis.cli``: the ``tsanalysis`` command (``python -m tsanalysis --help``), a thin shell over the above;
  nothing imports it.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("thinking-seeds")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0"
