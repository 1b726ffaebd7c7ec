"""Contracts: what the trainer, ``eval``, ``tsanalysis`` and the demo pass each other, owned by none of them.

``records`` is the run-record schema (written by the trainer, read by ``tsanalysis`` and ``figures``); ``passk`` the
pass@k and bootstrap estimators, the one k-grid, per-problem pass@k matrix and pass@k table; ``seed_lift`` the
restart values of Thinking Seeds (lift, rescue, zero advantage of a seeded step: the trainer's ``seeds/lift_*`` and
``tsanalysis seeds``); ``jsonl`` the one JSONL (and JSON-array) reader, its errors FILE:LINE; ``samples`` the
sample-file format (``eval.run`` writes it; eval, ``tsanalysis`` and the demo read it); ``files`` atomic writes;
``locks`` one writer per output (the lock a trainer holds on its run folder, ``eval.run`` on each results file);
``settings`` the "written with other settings" check of every resumable output; ``config`` the typed config
dataclass machinery (``Literal`` choices, YAML presets, ``key=value`` overrides). numpy, pyarrow and PyYAML only.
"""
