"""Inference, the layer above scoring: rollout engines and what they need.

- ``protocol``: the ``Sampler`` interface and ``Completion``;
- ``hf``: the Hugging Face KV-cache engine; ``vllm_engine``: the vLLM engine; ``engines``: ``make_sampler``
  (engine choice);
- ``stops``: the one rule for stop/EOS ids; ``loading``: ``load_policy`` from a path or hub id (``load_skeleton``:
  the model without weights, for an engine that loads them itself); ``hub``: where a model's files are (a hub id:
  its snapshot in the Hugging Face cache), what every loader and command resolves its model argument with;
- ``layers`` and ``flat``: the Llama-family layer math shared by the decoder and the flat training forward;
  ``batching``: micro-batches under a token budget;
- ``tiny``: the character tokenizer and tiny Llama models the tests and the demo build locally.

The names most callers need are importable from here.
"""

from inference.engines import make_sampler, resolve_engine
from inference.loading import load_policy, load_skeleton, load_tokenizer
from inference.protocol import Completion, Sampler
from inference.stops import stop_ids

__all__ = ["Completion", "Sampler", "load_policy", "load_skeleton", "load_tokenizer", "make_sampler", "resolve_engine",
           "stop_ids"]
