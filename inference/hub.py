"""Where a model's files are: a local folder as it is, a hub id as its snapshot in the Hugging Face cache.

The one home for hub ids. Every entry point that takes a model (``eval.run --model``, ``tsanalysis relay --early
/--final``, the trainer's ``model=``) and every loader (``inference.loading``, the vLLM engine's model path) turns
its argument into a local directory here, so a hub id is read from the same files by every rank, every engine
process and vLLM, and nothing re-saves a private copy of a model (a skeleton on the ``meta`` device cannot be).

``resolve_model(spec)``: a path that exists is a local folder, returned as it is. Anything else must be a hub id
(``owner/name``, or ``name``); ``huggingface_hub.snapshot_download`` finds its snapshot in the cache,
``$HF_HOME/hub/models--owner--name/snapshots/<commit>/`` with ``refs/main`` naming the commit, and, where downloads
are allowed (``download=True``, ``HF_HUB_OFFLINE`` unset, the hub reachable), first fetches what is missing: configs,
tokenizer files and safetensors weights (``HUB_FILES``). The result names the commit, so what a run records
(``ModelSource.identity``: ``owner/name@<commit>``) says which weights it read and stays the same each time the
same cached id is used. A hub id that is neither in the cache nor downloadable is a ``ModelSourceError``: one line
naming the argument, the cache and what to do.

Nothing here touches torch.distributed: downloading once per node while the other ranks wait is the trainer's
(``trainer.warmup.hub_snapshot``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HUB_FILES", "ModelSource", "ModelSourceError", "is_hub_id", "local_model_dir", "offline", "resolve_model"]

# what a snapshot download fetches: configs, tokenizers, chat templates, custom code, safetensors weights (a repo's
# duplicate *.bin / *.pt / *.gguf copies of the same weights are left on the hub)
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
_WEIGHTS = (".safetensors", ".bin")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class ModelSourceError(FileNotFoundError):
    """A model argument is neither a local folder nor a hub id whose snapshot is (or can be put) in the cache; the
    message is one line that names the argument and says what to do."""


@dataclass(frozen=True)
class ModelSource:
    spec: str                 # what was given: a path or a hub id
    path: str                 # the local directory holding the model's files
    revision: str | None      # a hub snapshot's commit hash; None for a local folder

    @property
    def is_hub(self) -> bool:
        return self.revision is not None

    @property
    def identity(self) -> str:
        """What a results file records as the model: ``owner/name@<commit>`` for a hub snapshot (the same wherever
        the cache lives), the absolute path for a local folder."""
        return f"{self.spec}@{self.revision}" if self.is_hub else str(Path(self.path).resolve())


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` can only mean a hub id: not an existing path, and shaped as ``owner/name`` or ``name``."""
    spec = str(spec)
    return (not os.path.exists(spec) and bool(_HUB_ID.fullmatch(spec)) and ".." not in spec and "--" not in spec
            and not spec.endswith((".", "-")))


def local_model_dir(spec: str, *, what: str = "model", download: bool = True) -> str:
    """The local directory of ``spec`` (``resolve_model(...).path``)."""
    return resolve_model(spec, what=what, download=download).path


def resolve_model(spec: str, *, what: str = "model", download: bool = True) -> ModelSource:
    """Where the files of ``spec`` are (see the module doc). ``what`` names the argument in errors (``--model``,
    ``model=``). ``download=False`` never asks the network: the snapshot must already be in the cache. Raises
    ``ModelSourceError`` when there is no such local folder and the hub id is not (and cannot be put) in the cache,
    or when the cached snapshot has no config.json or no weights."""
    spec = str(spec)
    if os.path.exists(spec):
        return ModelSource(spec=spec, path=spec, revision=None)
    if not is_hub_id(spec):
        raise ModelSourceError(f"{_label(what, spec)}: no such model folder (and not a hub id of the form owner/name)")
    from huggingface_hub import constants, snapshot_download

    cache = constants.HF_HUB_CACHE
    offline = _offline(constants)
    try:
        path = snapshot_download(spec, allow_patterns=HUB_FILES, local_files_only=offline or not download)
    except Exception as exc:   # every failure becomes the one line below (the hub's own messages span lines)
        raise ModelSourceError(_not_found(spec, what, cache, exc, offline=offline, download=download)) from None
    missing = _incomplete(Path(path))
    if missing:
        raise ModelSourceError(f"{_label(what, spec)}: the cached snapshot {path} has no {missing} (an interrupted or "
                               f"partial download): run `hf download {spec}` (or `huggingface-cli download {spec}`) "
                               f"where there is network, or pass a local model folder")
    return ModelSource(spec=spec, path=path, revision=Path(path).name)


def _label(what: str, spec: str) -> str:
    return f"{what}{spec}" if what.endswith("=") else f"{what} {spec}"   # model=owner/name, --model owner/name


def offline() -> bool:
    """Whether the hub may not be asked (``HF_HUB_OFFLINE``, as huggingface_hub reads it)."""
    from huggingface_hub import constants
    return _offline(constants)


def _offline(constants) -> bool:
    is_offline = getattr(constants, "is_offline_mode", None)
    return bool(is_offline() if is_offline is not None else constants.HF_HUB_OFFLINE)


def _incomplete(path: Path) -> str | None:
    names = [p.name for p in path.iterdir()] if path.is_dir() else []
    if "config.json" not in names:
        return "config.json"
    if not any(n.endswith(_WEIGHTS) for n in names):
        return "weights (*.safetensors)"
    return None


def _not_found(spec: str, what: str, cache: str, exc: Exception, *, offline: bool, download: bool) -> str:
    label, name = _label(what, spec), type(exc).__name__
    fix = (f"download it where there is network (`hf download {spec}`, or `huggingface-cli download {spec}`) and "
           f"copy that HF_HOME's hub/ folder into this one, or pass a local model folder")
    where = f"the local cache ({cache}; HF_HOME chooses it)"
    if name == "IncompleteSnapshotError":
        return f"{label}: the cached snapshot in {cache} is incomplete (an interrupted download): {fix}"
    if offline:
        return f"{label}: not a local folder, and HF_HUB_OFFLINE=1 but the hub id is not in {where}: {fix}"
    if not download:
        return f"{label}: not a local folder, and the hub id is not in {where}: {fix}"
    why = {"RepositoryNotFoundError": "the hub has no such model (or it is private: log in with `hf auth login`)",
           "GatedRepoError": "the model is gated: accept its terms on the hub and log in with `hf auth login`",
           "RevisionNotFoundError": "the hub has no such revision"}.get(name)
    if why is not None:
        return f"{label}: not a local folder, and {why}; or pass a local model folder"
    cause = exc.__cause__ or exc   # snapshot_download wraps the connection error it met
    detail = f"{type(cause).__name__}: " + " ".join(str(cause).split())[:200]
    return f"{label}: not a local folder, not in {where}, and the hub could not be reached ({detail}): {fix}"
