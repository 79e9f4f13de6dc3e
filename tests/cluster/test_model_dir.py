from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from cluster.hub_cache import HUB_FILES, default_hf_home, hub_cache_entry
from cluster.model_dir import (
    CHAT_TEMPLATE,
    DEFAULT_CONTEXT_TOKENS,
    MAX_CONTEXT,
    MAX_MESSAGES,
    MAX_TEXT_CHARS,
    SPECIAL_TOKENS,
    STAMP_FILE,
    ChatTokenizer,
    _render_builtin,
    build_model_dir,
    default_model_dir,
    is_models_own_dir,
    load_words,
    prepare_model_dir,
    word_token_ids,
)

FILES = (
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    STAMP_FILE,
)
SYSTEM = (
    "You are a careful assistant for a large company. Answer every question with short clear "
    "sentences, give an example when it helps, and never make up a fact you do not know. "
) * 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "disagg-tiny")


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer.from_dir(model_dir)


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_two_builds_are_byte_identical(tmp_path: Path, model_dir: Path) -> None:
    other = build_model_dir(tmp_path / "again")
    assert tuple(sorted(_files(other))) == tuple(sorted(FILES))
    assert _files(other) == _files(model_dir)


def test_a_build_is_skipped_when_identical_and_replaced_when_stale(tmp_path: Path) -> None:
    path = build_model_dir(tmp_path / "m")
    before = {name: (path / name).stat().st_mtime_ns for name in FILES}
    assert build_model_dir(path) == path
    assert {name: (path / name).stat().st_mtime_ns for name in FILES} == before
    build_model_dir(path, context_tokens=4096)  # other inputs: the stamp differs, so rebuild
    assert ChatTokenizer.from_dir(path).context_tokens == 4096
    (path / STAMP_FILE).write_text("{}")  # a damaged build is replaced as well
    build_model_dir(path)
    assert ChatTokenizer.from_dir(path).context_tokens == DEFAULT_CONTEXT_TOKENS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary leftovers


def test_concurrent_builders_do_not_clash(tmp_path: Path, model_dir: Path) -> None:
    errors: list[BaseException] = []

    def build() -> None:
        try:
            build_model_dir(tmp_path / "shared")
        except BaseException as e:  # collected: an exception in a thread would be lost
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _files(tmp_path / "shared") == _files(model_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]


def test_default_model_dir_honours_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISAGG_MODEL_DIR", str(tmp_path / "env"))
    assert default_model_dir() == tmp_path / "env"
    assert (tmp_path / "env" / "tokenizer.json").is_file()
    monkeypatch.delenv("DISAGG_MODEL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_model_dir() == tmp_path / "cache" / "disaggctl" / "models" / "disagg-tiny"
    # Another profile's context gets a directory of its own: no service rebuilds another's.
    other = default_model_dir(4096)
    assert other == tmp_path / "cache" / "disaggctl" / "models" / "disagg-tiny-ctx4096"
    assert ChatTokenizer.from_dir(other).context_tokens == 4096
    assert ChatTokenizer.from_dir(default_model_dir()).context_tokens == DEFAULT_CONTEXT_TOKENS


def test_the_word_pieces_are_plain_tokens_of_the_tiny_model(model_dir: Path) -> None:
    tok = ChatTokenizer.from_dir(model_dir)
    ids = word_token_ids()
    assert ids.start == len(SPECIAL_TOKENS) + 256 and len(ids) == 4 * len(load_words())
    # The first word's four pieces come first: "▁the", "▁The", "the", "The".
    assert tok.decode(list(ids[:4])) == "the ThetheThe"
    assert all(0 <= i < tok.vocab_size for i in (ids.start, ids.stop - 1))


def test_the_tokenizer_is_laid_out_as_a_hub_cache_entry(model_dir: Path, tmp_path: Path) -> None:
    """What an offline tool resolving a repo id (huggingface_hub's snapshot_download with
    local_files_only, as aiperf does) finds: refs/main naming a snapshot with the files."""
    from huggingface_hub import snapshot_download

    repo = hub_cache_entry(model_dir, tmp_path / "hf")
    assert repo == f"disaggctl/{model_dir.name}"
    assert hub_cache_entry(model_dir, tmp_path / "hf") == repo  # idempotent
    found = Path(snapshot_download(repo, cache_dir=tmp_path / "hf" / "hub", local_files_only=True))
    assert sorted(p.name for p in found.iterdir()) == sorted(HUB_FILES)
    assert (found / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    entry = tmp_path / "hf" / "hub" / f"models--disaggctl--{model_dir.name}"
    assert (entry / "refs" / "main").read_text() == found.name and len(found.name) == 40
    assert default_hf_home().parts[-2:] == ("disaggctl", "hf")


def test_the_files_carry_what_dynamo_and_transformers_read(model_dir: Path) -> None:
    tc = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tc["chat_template"] == CHAT_TEMPLATE
    assert tc["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tc["bos_token"], tc["eos_token"], tc["model_max_length"]) == (
        "<|begin_of_text|>",
        "<|eot_id|>",
        DEFAULT_CONTEXT_TOKENS,
    )
    config = json.loads((model_dir / "config.json").read_text())
    tok = ChatTokenizer.from_dir(model_dir)
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == tok.vocab_size and config["max_position_embeddings"] == 131_072
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"]
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    assert tok.eos_id in config["eos_token_id"]
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == config["eos_token_id"]


def test_the_vocabulary_holds_every_listed_word_as_one_token(tok: ChatTokenizer) -> None:
    words = load_words()
    assert len(words) >= 3000
    assert 12_000 <= tok.vocab_size <= 16_000
    ids = tok.encode(" ".join(words))
    assert len(ids) == len(words)
    assert len(tok.encode(" ".join(w.capitalize() for w in words))) == len(words)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world. The quick brown fox jumps over the lazy dog!",
        "Line one.\n\nLine two\twith a tab, 42 apples and (parentheses); done?",
        "naïve café, 東京 and 🙂 go through byte fallback",
        "a literal <0x41> stays text",
    ],
)
def test_plain_text_round_trips(tok: ChatTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@given(
    text=st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="▁"), max_size=200
    )
)
def test_any_text_not_starting_with_a_space_round_trips(tok: ChatTokenizer, text: str) -> None:
    # A leading space is absorbed by the word-start mark; special token strings are parsed.
    assume(not text.startswith(" ") and not any(s in text for s in SPECIAL_TOKENS))
    assert tok.decode(tok.encode(text)) == text


def test_chats_sharing_a_system_prompt_share_a_long_token_prefix(tok: ChatTokenizer) -> None:
    a = tok.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}])
    b = tok.encode_chat(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a cache?"}]
    )
    common = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    assert len(tok.encode(SYSTEM.strip())) >= 100
    assert common >= len(tok.encode(SYSTEM.strip()))
    assert a[:4] == tok.encode("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")


def test_the_chat_template_renders_roles_in_order_and_the_generation_prompt(
    tok: ChatTokenizer,
) -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hello there.  "},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Tell me more."},
    ]
    text = tok.apply_chat_template(chat)
    roles = re.findall(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>", text)
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert text.startswith("<|begin_of_text|>")
    assert "<|end_header_id|>\n\nHello there.<|eot_id|>" in text  # contents are trimmed
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    closed = tok.apply_chat_template(chat, add_generation_prompt=False)
    assert closed.endswith("Tell me more.<|eot_id|>") and text.startswith(closed)
    assert tok.encode_chat(chat) == tok.encode(text)


def test_the_builtin_renderer_matches_jinja(tok: ChatTokenizer) -> None:
    pytest.importorskip("jinja2")
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n Why?\n"}]
    for gen in (True, False):
        assert _render_builtin(chat, gen) == tok.apply_chat_template(chat, gen)


def test_sampled_output_reads_like_sentences(tok: ChatTokenizer) -> None:
    ids = tok.sample_output_ids(seed=7, n=400)
    assert len(ids) == 400 and ids == tok.sample_output_ids(seed=7, n=400)
    assert ids != tok.sample_output_ids(seed=8, n=400)
    specials = set(tok.encode("".join(SPECIAL_TOKENS)))
    assert all(0 <= i < tok.vocab_size and i not in specials for i in ids)
    text = tok.decode(ids)
    assert re.fullmatch(r"[A-Z][a-z]*( [A-Za-z]+|[.,?])*", text), text
    sentences = re.findall(r"[A-Z][a-z ,]*[.?]", text)
    assert len(sentences) >= 20 and text.count(",") >= 3
    assert "".join(tok.decode_stream(ids)) == text
    assert tok.sample_output_ids(seed=7, n=0) == []


def test_oversize_and_malformed_input_is_rejected(tok: ChatTokenizer, tmp_path: Path) -> None:
    assert len(tok.encode("a" * MAX_TEXT_CHARS)) >= 1
    with pytest.raises(ValueError, match="limit"):
        tok.encode("a" * (MAX_TEXT_CHARS + 1))
    with pytest.raises(ValueError, match="Unicode"):
        tok.encode("ok \ud800")  # a lone surrogate, as a JSON body may carry
    with pytest.raises(ValueError, match="limit"):
        tok.encode_chat([{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1))
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template([{"role": "user<|eot_id|>", "content": "hi"}])
    with pytest.raises(ValueError, match="content"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="n must"):
        tok.sample_output_ids(seed=0, n=tok.context_tokens + 1)
    with pytest.raises(ValueError, match="name"):
        build_model_dir(tmp_path / "x", name="../evil")
    with pytest.raises(ValueError, match="context_tokens"):
        build_model_dir(tmp_path / "x", context_tokens=10)


def test_transformers_loads_the_directory(model_dir: Path, tok: ChatTokenizer) -> None:
    transformers = pytest.importorskip("transformers")  # external; not a dependency of ours
    hf = transformers.AutoTokenizer.from_pretrained(os.fspath(model_dir))
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why, though?"}]
    rendered = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == tok.apply_chat_template(chat)
    ids = hf.encode(rendered, add_special_tokens=False)
    assert ids == tok.encode_chat(chat)
    assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert hf.eos_token_id == tok.eos_id
    config = transformers.AutoConfig.from_pretrained(os.fspath(model_dir))
    assert config.vocab_size == tok.vocab_size


# A chat template in the manner of Llama 3.1's: transformers' functions, AddedToken specials.
FOREIGN_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' and messages[0]['role'] != 'user' %}"
    "{{ raise_exception('the first message must be the system or the user') }}{% endif %}"
    "<date>{{ strftime_now('%Y') }}</date>"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _models_own_dir(path: Path) -> Path:
    """A model directory as Hugging Face writes one: a byte-level BPE tokenizer (trained here on
    a few sentences), its specials as AddedTokens, a context of 1e30 ("no limit")."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|begin|>", "<|eot|>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["The harbour is calm tonight.", "When is the next tide?",
                                   "Lighthouses guide ships, as they always did."] * 20, trainer)
    path.mkdir(parents=True)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|begin|>", "special": True}, "eos_token": "<|eot|>",
        "model_max_length": 1e30, "chat_template": FOREIGN_TEMPLATE,
    }))  # fmt: skip
    (path / "config.json").write_text("{}")
    return path


def test_a_models_own_directory_is_used_as_it_is_with_its_tokenizer(tmp_path: Path) -> None:
    own = _models_own_dir(tmp_path / "Llama-like")
    before = sorted((p.name, p.read_bytes()) for p in own.iterdir())
    assert is_models_own_dir(own) and prepare_model_dir(own) == own
    assert sorted((p.name, p.read_bytes()) for p in own.iterdir()) == before  # nothing written
    tok = ChatTokenizer.from_dir(own)
    assert (tok.bos_token, tok.eos_token) == ("<|begin|>", "<|eot|>")
    assert tok.context_tokens == MAX_CONTEXT  # "no limit", bounded
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tide?"}]
    text = tok.apply_chat_template(chat)
    assert text.startswith("<|begin|><date>2") and text.endswith("<|eot|><|assistant|>")
    ids = tok.encode_chat(chat)
    assert tok.decode(tok.encode("When is the next tide?")) == "When is the next tide?"
    assert ids[0] == tok.encode("<|begin|>")[0]
    with pytest.raises(ValueError, match="chat template: the first message"):
        tok.apply_chat_template([{"role": "assistant", "content": "hi"}])
    # Ours is rebuilt in place; an empty or a half directory gets ours too.
    ours = tmp_path / "ours"
    assert not is_models_own_dir(prepare_model_dir(ours))
    half = tmp_path / "half"
    half.mkdir()
    (half / "tokenizer.json").write_text("{}")
    assert not is_models_own_dir(half)
