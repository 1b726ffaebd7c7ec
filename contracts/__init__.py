"""Contracts: what the trainer, ``eval`` and ``tsanalysis`` pass each other, owned by none of them.

``records`` is the run-record schema (written by the trainer, read by ``tsanalysis`` and ``figures``), ``passk`` the
pass@k and bootstrap estimators, ``jsonl`` the one streamed JSONL reader. numpy and pyarrow only.
"""
