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

A model folder's files, read before any weights load, for every entry point alike: ``resolve_checked_model`` (where
the files are, and that a loader can read them: ``check_model_files``), ``checkpoint_dtype`` (the dtype it declares),
``model_context`` (the most tokens it holds) and ``check_context`` (the longest prompt plus its budget fits that
context, else a ``ContextError`` naming both numbers; ``context_overflow`` is the arithmetic, shared with the
trainer's validation, which words its own message).

A LoRA adapter folder (PEFT's ``adapter_config.json`` + ``adapter_model.safetensors``, what a LoRA run's
checkpoints hold: ``trainer.lora``) is a model too: ``resolve_checked_model`` resolves its base from
``base_model_name_or_path`` (a folder or a hub id, as any model argument) and returns the merged model, its
``merged/`` subfolder (written there once, base + adapter folded by PEFT's ``merge_and_unload``, or the one the
trainer wrote with ``export_merged``), so every engine and check downstream reads a plain Hugging Face folder.

Nothing here touches torch.distributed: downloading once per node while the other ranks wait is the trainer's
(``trainer.warmup.hub_snapshot``).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["ADAPTER_CONFIG", "CONTEXT_KEYS", "HUB_FILES", "MERGED_DIR", "TOKENIZER_FILES", "ContextError",
           "ContextOverflow", "ModelSource", "holds_model", "is_adapter_folder", "merged_adapter",
           "ModelSourceError", "check_context", "check_model_files", "checkpoint_dtype", "config_context",
           "context_overflow", "is_hub_id", "local_model_dir", "longest_prompt", "model_context", "newest_checkpoint",
           "offline", "resolve_checked_model", "resolve_model"]

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


def resolve_checked_model(spec: str, *, what: str = "--model") -> ModelSource:
    """Where the files of ``spec`` are (``resolve_model``: a saved model folder, or a hub id's snapshot in the cache,
    downloaded first where that is allowed; with ``HF_HUB_OFFLINE=1`` it must be cached), with its files checked
    (``check_model_files``: weights, shards, safetensors headers, tokenizer; a training run folder is named as one,
    with its newest checkpoint). ``what`` names the argument in the message (``--model``, ``--early``).
    ``ModelSourceError`` otherwise. What ``eval.run`` and ``tsanalysis relay`` call before anything is written.
    A LoRA adapter folder resolves to its merged model (``merged_adapter``)."""
    p = Path(spec).expanduser()
    if is_adapter_folder(p):
        return merged_adapter(p, what=what)
    if p.exists():
        check_model_files(p, what=f"{what} {spec}")
    source = resolve_model(str(p) if p.exists() else spec, what=what)
    if source.is_hub:
        check_model_files(Path(source.path), what=f"{what} {spec}")
    return source


ADAPTER_CONFIG = "adapter_config.json"   # PEFT's adapter folder (with adapter_model.safetensors)
MERGED_DIR = "merged"                    # an adapter folder's merged model: base + adapter as one Hugging Face model
MERGED_FROM = "merged_from.json"         # in merged/: the base (its identity) and the adapter file it was merged from


def holds_model(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a saved model: a Hugging Face model (``config.json``) or a LoRA adapter."""
    return (Path(folder) / "config.json").is_file() or is_adapter_folder(folder)


def is_adapter_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a PEFT adapter folder (``adapter_config.json``, no ``config.json`` of its own)."""
    folder = Path(folder)
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def merged_adapter(folder: Path, *, what: str = "--model") -> ModelSource:
    """The model a LoRA adapter folder stands for: its base (``adapter_config.json``'s ``base_model_name_or_path``,
    resolved and checked as any model argument) with the adapter merged, in ``folder/merged`` (written once:
    PEFT's ``PeftModel.from_pretrained`` then ``merge_and_unload``, in the base's dtype, saved to a temporary folder
    and renamed, with ``merged_from.json``: the base's identity, ``owner/name@<commit>`` for a hub id, and the
    adapter file's SHA-256; a merge whose record names another base snapshot or adapter file is made again, and a
    complete one without a record, e.g. the trainer's ``export_merged``, is used as it is). ModelSourceError, one line,
    when the base is not named or not found, or the folder cannot be written."""
    label = f"{what} {folder}"
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        base = config["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelSourceError(f"{label}: {folder / ADAPTER_CONFIG} is damaged ({type(e).__name__}: {e}); save "
                               f"the adapter again") from None
    if not base:
        raise ModelSourceError(f"{label}: {ADAPTER_CONFIG} names no base_model_name_or_path; set it to the base "
                               f"model's folder or hub id")
    source = resolve_checked_model(base, what=f"{label}: its base")
    merged = folder / MERGED_DIR
    made_from = _made_from(folder, source)
    if (merged / "config.json").is_file() and _recorded(merged) not in (None, made_from):
        # merged from another base snapshot (the hub's refs/main moved) or another adapter file: merged again
        import shutil
        shutil.rmtree(merged, ignore_errors=True)
    if not (merged / "config.json").is_file():
        try:
            _merge(folder, source.path, merged, made_from)
        except OSError as e:
            raise ModelSourceError(f"{label}: cannot write its merged model to {merged} ({e}); copy the adapter "
                                   f"folder somewhere writable, or save it with export_merged=true") from None
    check_model_files(merged, what=label)
    return ModelSource(spec=str(folder), path=str(merged), revision=None)


def _made_from(adapter: Path, base: ModelSource) -> dict:
    """What a merge is made from: the base's identity (``owner/name@<commit>``, or its folder) and the SHA-256 of
    each adapter weights file (a retrained adapter saved over the folder differs)."""
    import hashlib

    weights = {}
    for f in sorted(adapter.glob("adapter_model.*")):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        weights[f.name] = h.hexdigest()
    return {"base": base.identity, "adapter": weights}


def _recorded(merged: Path) -> dict | None:
    """The ``MERGED_FROM`` record of a merged folder; None when it has none (the trainer's ``export_merged``, or a
    merge written before the record existed: taken as it is)."""
    try:
        return json.loads((merged / MERGED_FROM).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _merge(adapter: Path, base: str, out: Path, made_from: dict) -> None:
    """PEFT's merge of ``adapter`` into the model of folder ``base``, saved to ``out`` with the adapter folder's
    tokenizer (the base's when it has none) and ``MERGED_FROM`` (``made_from``: the base's identity and the adapter
    file's hash, so a later call can tell a stale merge)."""
    import shutil
    import tempfile

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype="auto"), str(adapter))
    model = model.merge_and_unload()
    has_tokenizer = any((adapter / f).is_file() for f in TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter) if has_tokenizer else base)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MERGED_FROM).write_text(json.dumps(made_from, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _label(what: str, spec: str) -> str:
    return f"{what}{spec}" if what.endswith("=") else f"{what} {spec}"   # model=owner/name, --model owner/name


def offline() -> bool:
    """Whether the hub may not be asked (``HF_HUB_OFFLINE``, as huggingface_hub reads it)."""
    from huggingface_hub import constants
    return _offline(constants)


_REACHABLE: dict[str, bool] = {}


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's endpoint (``HF_ENDPOINT``, as huggingface_hub reads it) answers a TCP connection within
    ``timeout_s``: asked once per process, so a check offline says so at once instead of after the hub client's
    retries (five, up to 8 s apart)."""
    from urllib.parse import urlparse
    from huggingface_hub import constants
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    key = f"{host}:{port}"
    if key not in _REACHABLE:
        import socket
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            _REACHABLE[key] = True
        except OSError:
            _REACHABLE[key] = False
    return _REACHABLE[key]


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


# ---------------------------------------------------------------------------------- a model folder's files
# a tokenizer saved by ``save_pretrained`` has one of these (fast, sentencepiece, BPE, WordPiece), or a *.tiktoken
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
_STEP_DIR = re.compile(r"step_(\d+)")


def newest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The highest ``checkpoints/step_N`` of a training run that holds a model (``config.json``, or a LoRA adapter:
    ``holds_model``); None if none."""
    root = Path(run_dir) / "checkpoints"
    steps = [(int(m.group(1)), d) for d in (root.iterdir() if root.is_dir() else ())
             if (m := _STEP_DIR.fullmatch(d.name)) and holds_model(d)]
    return max(steps)[1] if steps else None


def check_model_files(folder: Path, *, what: str) -> None:
    """ModelSourceError, one line naming ``folder`` and what is missing or damaged, unless it is a model folder a
    loader can read: ``config.json``; weights (``model.safetensors``, or an index and every shard it lists, or
    ``pytorch_model.bin``), each safetensors file's header readable (``safetensors.safe_open`` reads only the
    header and checks it covers the file, so a truncated copy is found without loading anything); a tokenizer
    (``TOKENIZER_FILES``). A training run folder (``config.yaml``, ``checkpoints/``) is named as one, with its
    newest checkpoint. ``what``: the argument, for the message (``--model PATH``)."""
    if not folder.is_dir():
        raise ModelSourceError(f"{what}: {folder} is a file, not a model folder; give a saved model folder (e.g. "
                             f"runs/<name>/checkpoints/step_N) or a hub id")
    if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir() and not holds_model(folder):
        newest = newest_checkpoint(folder)
        use = (f"give one of its checkpoints instead, e.g. the newest: {newest}" if newest is not None else
               "it holds no saved checkpoint yet (checkpoints/step_N with a config.json)")
        raise ModelSourceError(f"{what}: {folder} is a training run folder (config.yaml, checkpoints/), not a "
                             f"checkpoint; {use}")
    if not (folder / "config.json").is_file():
        raise ModelSourceError(f"{what}: {folder} holds no config.json; give a saved model folder (e.g. "
                             f"runs/<name>/checkpoints/step_N) or a hub id")
    redo = "save or copy the checkpoint again, or use another one"
    try:   # a damaged config.json is the folder's fault (bad input), not a failure inside the run
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelSourceError(f"{what}: {folder / 'config.json'} is not valid JSON ({type(e).__name__}: {e}); "
                               f"{redo}") from None
    if not isinstance(config, dict):
        raise ModelSourceError(f"{what}: {folder / 'config.json'} is not a model config (a JSON object); {redo}")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelSourceError(f"{what}: {index} is damaged (not a weight index: {type(e).__name__}); "
                                 f"{redo}") from None
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    elif (folder / "pytorch_model.bin").is_file() or (folder / "pytorch_model.bin.index.json").is_file():
        shards = []   # pickled weights: no cheap check of their integrity (torch.load reads them whole)
    else:
        raise ModelSourceError(f"{what}: {folder} has no weights (model.safetensors, or model.safetensors.index.json "
                             f"and its shards): the checkpoint was not saved completely; {redo}")
    from safetensors import SafetensorError, safe_open
    for name in shards:
        shard = folder / name
        if not shard.is_file():
            raise ModelSourceError(f"{what}: {folder} is missing the weight shard {name} that {index.name} lists; "
                                 f"{redo}")
        try:
            with safe_open(str(shard), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise ModelSourceError(f"{what}: {shard} is damaged (its safetensors header cannot be read: "
                                 f"{' '.join(str(e).split())}; a truncated copy?); {redo}") from None
    if not any((folder / f).is_file() for f in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        raise ModelSourceError(f"{what}: {folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
                             f"save the tokenizer into the folder with the model (tokenizer.save_pretrained)")


def checkpoint_dtype(model_dir: str | os.PathLike) -> str:
    """The dtype a saved model declares (``config.json``'s ``dtype``, or ``torch_dtype`` as transformers 4 wrote it);
    float32 when it declares none (what ``inference.load_skeleton`` assumes too)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    declared = (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None
    return str(declared).replace("torch.", "") if declared else "float32"


# config.json keys that bound a model's positions, as vLLM reads them (``derive_max_model_len_and_key``: the smallest
# one present wins), and the RoPE types whose ``factor`` does not multiply them (vLLM's ``_get_and_verify_max_len``:
# YaRN and the others leave max_position_embeddings already scaled)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_ROPE_ALREADY_SCALED = ("default", "su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def model_context(model_dir: str | os.PathLike) -> tuple[int, str] | None:
    """The most tokens (prompt + response) a saved model can hold, and the config.json key that says so, as vLLM
    derives its ``max_model_len`` from the same file: the smallest of ``CONTEXT_KEYS`` present (in ``text_config``
    for a multimodal config), times the RoPE scaling ``factor`` for the types that extend it (``dynamic``,
    ``linear``). None when config.json names no such key (vLLM would then assume 2048; nothing is checked).

    The tokenizer's ``model_max_length`` is not used: vLLM consults it only for pooling models, transformers
    writes a 1e30 placeholder when a tokenizer has none, and DeepSeek-R1-Distill-Qwen-7B's tokenizer says 16384 for
    a model of 131072 positions (its card evaluates with 32768 new tokens; docs/evaluation.md)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config_context(config)


def config_context(config) -> tuple[int, str] | None:
    """``model_context`` of a model's config as a dict (``config.json``, or ``PretrainedConfig.to_dict()`` of a
    model built in memory); None when it names no context."""
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    found = [(int(config[k]), k) for k in CONTEXT_KEYS if isinstance(config.get(k), (int, float))
             and not isinstance(config.get(k), bool)]
    if not found:
        return None
    context, key = min(found, key=lambda x: x[0])
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        if kind not in _ROPE_ALREADY_SCALED and isinstance(factor, (int, float)) and factor:
            return int(context * factor), f"{key} x rope_scaling.factor {factor:g}"
    return context, key


# ---------------------------------------------------------------------------------- a prompt and its budget
class ContextError(ValueError):
    """The longest prompt plus its response budget does not fit a model's context; the message is one line naming
    both numbers and what to do."""


@dataclass(frozen=True)
class ContextOverflow:
    """The longest prompt that, with ``max_tokens`` new tokens, does not fit ``limit`` tokens."""
    prompt_tokens: int        # the longest prompt's token count
    problem_id: str | None    # whose prompt it is
    max_tokens: int
    limit: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def room(self) -> int:
        """The largest budget that would fit (< 1: the prompt alone fills the context)."""
        return self.limit - self.prompt_tokens


def longest_prompt(prompt_ids: Mapping[str, Sequence[int]]) -> tuple[int, str | None]:
    """(token count, problem id) of the longest of ``prompt_ids`` (problem id -> the rendered prompt's token ids);
    (0, None) when there are none."""
    if not prompt_ids:
        return 0, None
    pid = max(prompt_ids, key=lambda k: len(prompt_ids[k]))
    return len(prompt_ids[pid]), pid


def context_overflow(prompt_ids: Mapping[str, Sequence[int]], max_tokens: int,
                     limit: int | None) -> ContextOverflow | None:
    """The longest prompt plus ``max_tokens`` against ``limit`` tokens: None when it fits (or ``limit`` is None, or
    there are no prompts), else what does not fit. The one comparison; each caller words its own message."""
    P, pid = longest_prompt(prompt_ids)
    if limit is None or pid is None or P + int(max_tokens) <= limit:
        return None
    return ContextOverflow(P, pid, int(max_tokens), int(limit))


def check_context(what: str, prompt_ids: Mapping[str, Sequence[int]], max_tokens: int,
                  context: tuple[int, str] | None, *, cap: int | None = None, where: str = "config.json",
                  hint: str = "") -> None:
    """ContextError, one line naming both numbers, unless the longest prompt plus ``max_tokens`` new tokens fits
    the model's context: ``context`` (tokens, the config.json key that says so: ``model_context``; None: unknown,
    only ``cap`` is checked) and ``cap`` (a smaller limit the config asks for, eval's ``max_context``).
    A response that runs past the context is not an error any engine reports: the HF engine extrapolates the
    positions (rotary embeddings it was not trained on), vLLM refuses at start-up or cuts the request. ``what``:
    the argument and the benchmark, for the message; ``where``: the config.json named; ``hint``: appended to the
    way out."""
    limits = [(c, f"the model's context {c} ({k} in {where})") for c, k in [context] if context is not None]
    if cap is not None:
        limits.append((cap, f"max_context {cap}"))
    if not limits or longest_prompt(prompt_ids)[0] == 0:
        return
    C, said = min(limits, key=lambda x: x[0])
    over = context_overflow(prompt_ids, max_tokens, C)
    if over is None:
        return
    fix = (f"lower --max-tokens to <= {over.room}" if over.room >= 1 else
           "the prompt alone fills it: drop the problem or use a model with a longer context")
    raise ContextError(f"{what}: the longest prompt (problem {over.problem_id!r}) of {over.prompt_tokens} tokens + "
                       f"max_tokens {max_tokens} = {over.total} > {said}; {fix}{hint}")
