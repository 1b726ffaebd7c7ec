"""Pure estimators of the analysis (numpy/pandas only: no file IO, no torch, no config objects).

- ``bins``: per-position binning (relative ``floor(n_bins*t/L)`` and absolute), streaming accumulators.
- ``truncation``: categories and histograms of the tokens at the truncation points (Figure 5).
- ``lemma4``: zero-advantage / all-wrong probabilities, Monte Carlo check, shared vs independent seeds,
  observed vs predicted zero-advantage groups of a run.
- ``mismatch``: accumulated behavior/current log-ratio and KL along seed tokens (Proposition 2).
- ``seed_lift``: restart values of the seeds (lift against the fresh group by cut depth, seed age and token type,
  rescue, zero advantage vs Lemma 4 for independent and shared seeds; definitions in ``contracts.seed_lift``).
- ``support``: problems gained / lost / kept between two models per k, the crossover k, answer clusters,
  distinct answers and answer entropy (arXiv:2504.13837, 2507.14843, 2509.21128).
(pass@k, avg@n and the bootstrap live in ``contracts.passk``, shared with ``eval``.)
"""
