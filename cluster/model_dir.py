"""A tiny model directory generated offline: tokenizer, chat template and a llama-style config.

Two users (docs/design.md §6, "Dynamo (real)", and the serve runtime): the serve ingress tokenizes
prompts with it, so chats that share a system prompt share a token prefix and hence KV blocks, and
detokenizes the simulated engines' output ids into readable text; ``dynamo.mocker --model-path DIR``
loads the same directory, so both sides see the same token ids and the same block hashes.

The tokenizer is a Unigram model over ``cluster/data/words.txt`` (a few thousand common English
words, four pieces each: ``▁word``, ``▁Word``, ``word``, ``Word``), every printable ASCII
character and 256 byte-fallback pieces, so every string encodes and ``decode(encode(text)) ==
text`` (except a leading space). Scores make a listed word one token: a word piece scores above
−20, two pieces below it.
Nothing is downloaded and nothing is trained: the build is a pure function of the word list.

With real weights (``dynamo.vllm`` on GPUs) the service's ``model_dir`` is the model's own
directory instead (:func:`prepare_model_dir`): the ingress then tokenizes with the model's own
tokenizer and chat template, as vLLM and Dynamo's frontend do, and nothing there is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import string
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

FORMAT_VERSION = 1  # bump when the generated files change for the same inputs
WORDS_FILE = Path(__file__).parent / "data" / "words.txt"
STAMP_FILE = "disaggctl-build.json"
MAX_CONTEXT = 1 << 20  # tokens: a model's context beyond this is taken as this
# The embedded default serves Llama-3.1-70B's context (its config's max_position_embeddings), so
# production prompts (Mooncake's reach 126k tokens) are taken as the model would take them.
DEFAULT_CONTEXT_TOKENS = 131_072
MAX_TEXT_CHARS = 1 << 20  # encode() refuses longer text: bounds the work one request can cause
MAX_MESSAGES = 512  # apply_chat_template() refuses longer chats
BOS, EOT_TEXT, HEADER_START, HEADER_END, EOT, UNK = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<unk>",
)
SPECIAL_TOKENS = (UNK, BOS, EOT_TEXT, HEADER_START, HEADER_END, EOT)  # ids 0..5, in this order
SPACE = "▁"  # SentencePiece's word-start mark: spaces become part of the following piece
# Llama-3 style, in HF's dialect (``messages``, ``add_generation_prompt``, ``bos_token``); Dynamo's
# frontend renders it with minijinja, transformers and this module with a sandboxed jinja2.
CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ROLE = re.compile(r"[a-z_]{1,32}")  # a role is pasted into the prompt: no markup may hide in it
_WORD_PIECE = re.compile(SPACE + r"[a-z]+")


@dataclass(frozen=True)
class BuildStamp:
    """Everything a build depends on; an existing directory with an equal stamp is reused."""

    format: int
    name: str
    context_tokens: int
    words_sha256: str
    tokenizers_version: str  # the serializer of tokenizer.json


def load_words(path: Path = WORDS_FILE) -> list[str]:
    """The word list, most frequent first (lowercase a-z, unique)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    words = [w.strip() for w in lines if w.strip() and not w.startswith("#")]
    bad = [w for w in words if not re.fullmatch(r"[a-z]+", w)]
    if bad or len(set(words)) != len(words):
        raise ValueError(f"{path}: words must be unique lowercase a-z, got {bad[:5]}")
    return words


def word_token_ids(words: Sequence[str] | None = None) -> range:
    """The ids of the word pieces (``▁word``, ``▁Word``, ``word``, ``Word`` of every listed
    word), which follow the special tokens and the 256 byte pieces: plain tokens of the tiny
    model, and ids every served model's vocabulary holds (trace prompts are drawn from them,
    ``cluster.traces.prompts``)."""
    first = len(SPECIAL_TOKENS) + 256
    return range(first, first + 4 * len(words if words is not None else load_words()))


def _pieces(words: Sequence[str]) -> list[tuple[str, float]]:
    """(piece, log-probability) in id order. A word of rank r scores −(10 + ln(r + 2)) > −20 and
    any two pieces score < −20, so Viterbi keeps a listed word whole; characters (−30) spell the
    rest; byte pieces (−1000) lose to a literal "<0x41>" spelled in characters, yet still serve
    as byte fallback for characters outside the vocabulary."""
    vocab: dict[str, float] = dict.fromkeys(SPECIAL_TOKENS, 0.0)
    vocab.update({f"<0x{b:02X}>": -1000.0 for b in range(256)})
    for rank, word in enumerate(words):
        base = -(10.0 + math.log(rank + 2))
        cap = word.capitalize()
        for k, piece in enumerate((SPACE + word, SPACE + cap, word, cap)):
            vocab.setdefault(piece, base - 0.25 * k)
    for c in string.ascii_letters + string.digits + string.punctuation + "\n\t" + SPACE:
        vocab.setdefault(c, -30.0)
    return list(vocab.items())


def _make_tokenizer(words: Sequence[str]) -> Tokenizer:
    tok = Tokenizer(models.Unigram(_pieces(words), unk_id=0, byte_fallback=True))
    # Whitespace split (Metaspace keeps the space on the next word, so nothing is lost), then
    # punctuation split; "first" marks only the start of the text, as Llama-2's legacy=False.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=True),
            pre_tokenizers.Punctuation("isolated"),
        ]
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace(SPACE, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),  # drop the mark that "first" prepended
        ]
    )
    # No post-processor: the chat template writes <|begin_of_text|> itself; adding it again here
    # would give Dynamo (which encodes the rendered prompt) a double BOS.
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _dump(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _render_files(name: str, context_tokens: int, words: Sequence[str]) -> dict[str, bytes]:
    """The directory's files, as bytes: a pure function of the inputs (deterministic builds)."""
    tok = _make_tokenizer(words)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    eos_ids = [ids[EOT_TEXT], ids[EOT]]  # a turn ends at <|eot_id|>, a document at end_of_text
    special_map = {"bos_token": BOS, "eos_token": EOT, "unk_token": UNK}
    tokenizer_config = {
        **special_map,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_tokens,
        "clean_up_tokenization_spaces": False,  # our decoder already spaces words correctly
        "model_input_names": ["input_ids", "attention_mask"],
        "name_or_path": name,
    }
    # A plausible tiny llama: engines and the mocker read shapes and limits, never weights.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "max_position_embeddings": context_tokens,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ids[BOS],
        "eos_token_id": eos_ids,
        "pad_token_id": None,
    }
    generation = {
        "bos_token_id": ids[BOS],
        "eos_token_id": eos_ids,
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_length": context_tokens,
    }
    return {
        "tokenizer.json": (tok.to_str(pretty=True) + "\n").encode(),
        "tokenizer_config.json": _dump(tokenizer_config),
        "special_tokens_map.json": _dump(special_map),
        "config.json": _dump(config),
        "generation_config.json": _dump(generation),
    }


def _stamp(name: str, context_tokens: int, words_path: Path) -> BuildStamp:
    digest = hashlib.sha256(words_path.read_bytes()).hexdigest()
    return BuildStamp(FORMAT_VERSION, name, context_tokens, digest, tokenizers.__version__)


def _has_stamp(path: Path, stamp: BuildStamp) -> bool:
    try:
        found = json.loads((path / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found == asdict(stamp))


def build_model_dir(
    path: Path, *, name: str = "disagg-tiny", context_tokens: int = DEFAULT_CONTEXT_TOKENS
) -> Path:
    """Write the model directory at ``path`` (docs/design.md §6) and return ``path``.

    Idempotent: a directory whose stamp equals this build's is left alone. Atomic: files go to a
    temporary sibling renamed into place, so readers never see half a directory and concurrent
    builders, which produce identical bytes, cannot clash; a stale build is swapped out."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"name must match {_NAME.pattern}, got {name!r}")
    if not 256 <= context_tokens <= MAX_CONTEXT:
        raise ValueError(f"context_tokens must lie in [256, 2^20], got {context_tokens}")
    path = Path(path)
    stamp = _stamp(name, context_tokens, WORDS_FILE)
    if _has_stamp(path, stamp):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        files = _render_files(name, context_tokens, load_words(WORDS_FILE))
        files[STAMP_FILE] = _dump(asdict(stamp))  # last: its presence marks a complete build
        for fname, data in files.items():
            (tmp / fname).write_bytes(data)
        for _ in range(8):  # a few rounds: other builders may be swapping the same path
            try:
                os.rename(tmp, path)  # atomic; fails if path is a non-empty directory
                return path
            except OSError:
                if _has_stamp(path, stamp):
                    return path  # another builder finished the same build first
                old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
                try:
                    os.rename(path, old)
                except FileNotFoundError:
                    continue
                shutil.rmtree(old, ignore_errors=True)
        raise OSError(f"could not install the model directory at {path}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once renamed


def is_models_own_dir(path: Path) -> bool:
    """Whether ``path`` holds a model's own tokenizer files (``tokenizer.json`` and
    ``tokenizer_config.json``, as Hugging Face writes them) and no build of ours."""
    path = Path(path)
    return (
        all((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        and not (path / STAMP_FILE).exists()
    )


def prepare_model_dir(path: Path) -> Path:
    """The service's ``model_dir``: a model's own directory (the weights an engine such as vLLM
    loads, with their tokenizer) is used as it is and never written; any other path gets the
    project's tiny model, built there (``build_model_dir``)."""
    path = Path(path)
    return path if is_models_own_dir(path) else build_model_dir(path)


def _token_text(token: object) -> str:
    if isinstance(token, Mapping):
        token = token.get("content")
    if not isinstance(token, str):
        raise ValueError(f"a special token must be a string or {{content: ...}}, got {token!r}")
    return token


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


def default_model_dir(context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> Path:
    """``$DISAGG_MODEL_DIR``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/disaggctl/models/disagg-tiny`` (``disagg-tiny-ctx<N>`` for another context than the
    default's, so services of different models never rebuild each other's); built on first
    use, with ``context_tokens`` of context (the served profile's model's)."""
    env = os.environ.get("DISAGG_MODEL_DIR")
    if env:
        return build_model_dir(Path(env), context_tokens=context_tokens)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    suffix = "" if context_tokens == DEFAULT_CONTEXT_TOKENS else f"-ctx{context_tokens}"
    name = "disagg-tiny" + suffix
    return build_model_dir(cache / "disaggctl" / "models" / name, context_tokens=context_tokens)


def _render_builtin(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
    """CHAT_TEMPLATE rendered by hand, for when jinja2 is not installed (same text; tested)."""
    parts = [BOS] + [
        f"{HEADER_START}{m['role']}{HEADER_END}\n\n{m['content'].strip()}{EOT}" for m in messages
    ]
    if add_generation_prompt:
        parts.append(f"{HEADER_START}assistant{HEADER_END}\n\n")
    return "".join(parts)


class ChatTokenizer:
    """The tokenizer of a model directory, as the serve ingress uses it (docs/design.md §6).

    Special token strings inside message contents are not escaped, exactly as in HF and Dynamo:
    the point is that the ingress and the engines compute the same ids."""

    # Any: a model's tokenizer_config.json, whose values each key's reader checks.
    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any]) -> None:
        self._tok = tokenizer
        self.chat_template: str = config["chat_template"]
        # A model's own tokenizer_config.json may write a token as an AddedToken ({"content":
        # ...}), leave BOS out, and state a "no limit" context of 1e30.
        self.bos_token: str = _token_text(config.get("bos_token")) or ""
        self.eos_token: str = _token_text(config["eos_token"])
        self.context_tokens: int = int(min(float(config["model_max_length"]), MAX_CONTEXT))
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        eos = tokenizer.token_to_id(self.eos_token)
        if eos is None:
            raise ValueError(f"eos_token {self.eos_token!r} is not in the vocabulary")
        self.eos_id: int = eos
        self._template: Any = None  # a jinja2 Template (jinja2 is imported lazily)
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # the built-in renderer knows only our own template
            if self.chat_template != CHAT_TEMPLATE:
                raise RuntimeError("jinja2 is needed to render a custom chat template") from None
        else:  # transformers' settings, so both render the stored template identically
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            # The functions transformers gives chat templates (Llama 3.1's calls both).
            env.globals.update(raise_exception=_raise_template_error, strftime_now=_strftime_now)
            self._template = env.from_string(self.chat_template)
        # Sampling pool: "▁word" pieces in id order, which is frequency rank (see _pieces).
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        pool = sorted((i, p) for p, i in vocab.items() if _WORD_PIECE.fullmatch(p))
        self._lower = [i for i, _ in pool]
        self._upper = [vocab.get(SPACE + p[1:].capitalize(), i) for i, p in pool]
        self._cum = list(accumulate(1.0 / (r + 10) for r in range(len(pool))))  # Zipf-like
        self._punct = {c: vocab[c] for c in ".,?" if c in vocab}
        if (i_piece := vocab.get(SPACE + "i")) in self._lower:  # the pronoun is always "I"
            self._lower[self._lower.index(i_piece)] = vocab.get(SPACE + "I", i_piece)

    @classmethod
    def from_dir(cls, path: Path) -> ChatTokenizer:
        """Load the tokenizer files of a model directory (``build_model_dir``'s, or a model's
        own: :func:`prepare_model_dir`)."""
        path = Path(path)
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        return cls(Tokenizer.from_file(str(path / "tokenizer.json")), config)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special token strings map to their ids; no BOS is added).
        Raises ValueError beyond MAX_TEXT_CHARS characters or on lone surrogates (JSON allows
        "\\ud800"; the Rust tokenizer would fail with a TypeError)."""
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text has {len(text)} characters, the limit is {MAX_TEXT_CHARS}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text is not valid Unicode at character {e.start}") from None
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of a chat, rendered from the template in tokenizer_config.json."""
        if len(messages) > MAX_MESSAGES:
            raise ValueError(f"{len(messages)} messages, the limit is {MAX_MESSAGES}")
        for k, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not _ROLE.fullmatch(role):
                raise ValueError(f"messages[{k}].role must match {_ROLE.pattern}, got {role!r}")
            if not isinstance(content, str):
                raise ValueError(f"messages[{k}].content must be a string")
        if self._template is None:
            return _render_builtin(messages, add_generation_prompt)
        return str(
            self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat: what the engine prefills and the router hashes."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` without special tokens. Raises ValueError on ids outside the vocab."""
        ids = list(ids)
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size})")
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def decode_stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Text deltas for streamed ids (SSE chunks): joined, they equal ``decode(ids)``; one id
        decoded alone would lose the space before its word."""
        stream = decoders.DecodeStream(skip_special_tokens=True)
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside [0, {self.vocab_size})")
            if (delta := stream.step(self._tok, i)) is not None:
                yield delta

    def sample_output_ids(self, seed: int, n: int) -> list[int]:
        """``n`` deterministic pseudo-random ids that decode to sentences: Zipf-weighted words,
        a capital after each full stop, occasional commas and questions. No special tokens and
        no EOS: where the output ends is the caller's (the simulated engine's) decision."""
        if not 0 <= n <= self.context_tokens:
            raise ValueError(f"n must lie in [0, {self.context_tokens}], got {n}")
        rng = random.Random(seed)  # Mersenne Twister: stable across platforms and versions
        out: list[int] = []
        left = 0  # words left in the current sentence
        while len(out) < n:
            if left == 0:
                left = rng.randint(4, 14)
                k = rng.choices(range(len(self._lower)), cum_weights=self._cum)[0]
                out.append(self._upper[k])
            else:
                k = rng.choices(range(len(self._lower)), cum_weights=self._cum)[0]
                out.append(self._lower[k])
            left -= 1
            if left == 0:
                out.append(self._punct["?" if rng.random() < 0.1 else "."])
            elif left > 1 and rng.random() < 0.08:
                out.append(self._punct[","])
        return out[:n]
