"""The inference layer's choice names, torch-free: config modules and command lines import them without loading
torch or transformers (``python -m eval.run --help``, a ``tsanalysis`` command, a config error stay fast).

``EngineName`` is the one list of rollout engines (config fields are typed with it, argparse takes ``ENGINES``);
``TINY_SIZES`` the shapes of the tiny Llamas that ``inference.tiny`` builds (``tiny:<size>``).
"""

from __future__ import annotations

import typing
from typing import Literal

__all__ = ["EngineName", "ENGINES", "TINY_SIZES"]

EngineName = Literal["hf", "vllm", "auto"]
ENGINES: tuple[str, ...] = typing.get_args(EngineName)

# Shapes of the tiny Llamas. All tie the input and output embeddings and use full multi-head attention
# (num_key_value_heads == num_attention_heads), head_dim 32 or 64. Parameter counts (tied, vocab 100):
#   1m: 1.06M   2m: 2.09M   5m: 5.14M   20m: 19.3M
TINY_SIZES: dict[str, dict[str, int]] = {
    "1m": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512),
    "2m": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, intermediate_size=640),
    "5m": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=768),
    "20m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1408),
}
