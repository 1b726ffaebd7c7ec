"""Helpers the tests share (imported as ``tests.helpers.<module>``) and the scripts the tests start with torchrun or
a fresh interpreter (``*_worker.py``)."""
