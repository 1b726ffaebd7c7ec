"""Inference, the layer above scoring: rollout engines and what they need.

- ``protocol``: the ``Sampler`` interface and ``Completion``;
- ``hf``: the Hugging Face KV-cache engine; ``vllm_engine``: the vLLM engine; ``engines``: ``make_sampler``
  (engine choice);
- ``stops``: the one rule for stop/EOS ids; ``loading``: ``load_policy`` from a path or hub id (``load_skeleton``:
  the model without weights, for an engine that loads them itself); ``hub``: where a model's files are (a hub id:
  its snapshot in the Hugging Face cache), what every loader and command resolves its model argument with;
- ``layers`` and ``flat``: the Llama-family layer math shared by the decoder and the flat training forward;
  ``batching``: micro-batches under a token budget;
- ``tiny``: the character tokenizer and tiny Llama models the tests and the demo build locally;
- ``names``: the choice names (engines, tiny sizes), torch-free.

The names most callers need are importable from here, loaded on first use (PEP 562), so that importing a light
submodule (``inference.names``, ``inference.hub``) does not load torch and transformers.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the same names for type checkers and the layering test's reader; at run time see __getattr__
    from inference.engines import make_sampler, resolve_engine
    from inference.loading import load_policy, load_skeleton, load_tokenizer
    from inference.protocol import Completion, Sampler
    from inference.stops import stop_ids

_EXPORTS = {"Completion": "protocol", "Sampler": "protocol", "load_policy": "loading", "load_skeleton": "loading",
            "load_tokenizer": "loading", "make_sampler": "engines", "resolve_engine": "engines", "stop_ids": "stops"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"inference.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'inference' has no attribute {name!r}")
