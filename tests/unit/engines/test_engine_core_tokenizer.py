"""Shipped tokenizer, chat rendering and the deterministic generator."""

from __future__ import annotations

import hashlib
import io
import json
import random
import string
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from fake_engines.build_tokenizer import write_files
from fake_engines.core import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    data_dir,
    decode,
    encode,
    eos_token_id,
    expected_chat_completion,
    expected_completion,
    find_tag,
    generate_ids,
    generate_text,
    output_digest,
    prompt_digest,
    render_chat,
    token_pieces,
    tokenizer_zip_bytes,
    vocab_size,
)
from fake_engines.core.generator import word_token_ids
from fake_engines.core.tokenizer import load_tokenizer

TEXTS = [
    "[pdchaos:run:1] Tell me about the river.",
    "[pdchaos:2026-11-30T02-50-00:123456] x",
    "",
    " leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand   runs of   spaces",
    "punctuation !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ 0123456789",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "unicode too: café, naïve, 日本語, emoji 🙂",
    "Zzyzx qwrtp xkcd supercalifragilistic",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_lossless(text: str) -> None:
    assert decode(encode(text)) == text


def test_round_trip_random_ascii() -> None:
    rng = random.Random(1234)
    alphabet = string.printable  # letters, digits, punctuation, whitespace incl. \r \x0b \x0c
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        tagged = f"[pdchaos:r{rng.randint(0, 99)}:{rng.randint(0, 10**6)}]{text}"
        assert decode(encode(tagged)) == tagged
        assert find_tag(decode(encode(tagged))) == tagged[: tagged.index("]") + 1]


def test_tag_survives_tokenization() -> None:
    prompt = "[pdchaos:run7:42] What is the weather like?"
    assert find_tag(decode(encode(prompt))) == "[pdchaos:run7:42]"


def test_special_tokens_are_single_ids() -> None:
    for tok in SPECIAL_TOKENS:
        assert len(encode(tok)) == 1
    assert encode(EOS_TOKEN) == [eos_token_id()]


def test_vocab_size_in_range_and_config_agrees() -> None:
    assert 2000 <= vocab_size() <= 4000
    config = json.loads((data_dir() / "config.json").read_text())
    assert config["vocab_size"] == vocab_size()
    assert config["eos_token_id"] == eos_token_id()
    assert config["model_type"] and config["architectures"]
    tk_config = json.loads((data_dir() / "tokenizer_config.json").read_text())
    assert tk_config["chat_template"] == CHAT_TEMPLATE
    assert tk_config["eos_token"] == EOS_TOKEN


def test_committed_files_match_a_fresh_build(tmp_path: Path) -> None:
    write_files(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (tmp_path / name).read_bytes() == (data_dir() / name).read_bytes(), name


def test_tokenizer_zip_and_sha256(tmp_path: Path) -> None:
    data, sha = tokenizer_zip_bytes()
    assert sha == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
        for name in zf.namelist():
            assert zf.read(name) == (data_dir() / name).read_bytes()
        zf.extractall(tmp_path)
    # what a gateway does with it: load the extracted tokenizer and get the same ids
    extracted = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert extracted.encode(TEXTS[0], add_special_tokens=False).ids == encode(TEXTS[0])


def test_zip_is_reproducible() -> None:
    tokenizer_zip_bytes.cache_clear()
    first = tokenizer_zip_bytes()
    tokenizer_zip_bytes.cache_clear()
    assert tokenizer_zip_bytes() == first


# -- chat --------------------------------------------------------------------------------------------------


def test_render_chat() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "[pdchaos:r:1] hi"}]
    assert render_chat(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n[pdchaos:r:1] hi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat(messages, add_generation_prompt=False).endswith("hi<|im_end|>\n")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat(parts) == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_matches_render_chat_under_jinja() -> None:
    jinja2 = pytest.importorskip("jinja2")  # gateways render the template with Jinja; the engine with Python
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "[pdchaos:r:1] two\nlines"}]
    for agp in (True, False):
        rendered = env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=agp)
        assert rendered == render_chat(messages, add_generation_prompt=agp)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"content": "no role"}],
        ["not a dict"],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
    ],
)
def test_render_chat_rejects_bad_messages(messages: object) -> None:
    with pytest.raises(ValueError):
        render_chat(messages)  # type: ignore[arg-type]


# -- generator ---------------------------------------------------------------------------------------------


def test_prompt_digest_shape_and_sensitivity() -> None:
    d = prompt_digest([1, 2, 3])
    assert len(d) == 16 and int(d, 16) >= 0
    assert d == hashlib.sha256(b"1,2,3").hexdigest()[:16]
    assert prompt_digest([1, 2, 3]) != prompt_digest([1, 2, 4])
    assert prompt_digest([12, 3]) != prompt_digest([1, 23])
    assert output_digest([1, 2, 3]) == d


def test_generation_is_deterministic_and_seed_sensitive() -> None:
    d = prompt_digest(encode("[pdchaos:r:1] hello"))
    assert generate_ids(d, 20, 7) == generate_ids(d, 20, 7)
    assert generate_ids(d, 20, 7) != generate_ids(d, 20, 8)
    assert generate_ids(d, 20, None) == generate_ids(d, 20, 0)
    assert generate_ids(d, 5, 7) == generate_ids(d, 20, 7)[:5]  # a prefix, like a shorter max_tokens
    assert generate_ids(d, 0) == []
    with pytest.raises(ValueError):
        generate_ids(d, -1)


def test_wrong_kv_gives_different_text() -> None:
    right = prompt_digest(encode("[pdchaos:r:1] first request"))
    wrong = prompt_digest(encode("[pdchaos:r:2] second request"))
    assert generate_text(right, 16) != generate_text(wrong, 16)
    assert expected_completion("[pdchaos:r:1] first request", 16, None) == generate_text(right, 16)


def test_output_is_plain_words_from_the_word_list() -> None:
    words = set(word_token_ids())
    ids = generate_ids("abc", 50, 1)
    assert set(ids) <= words
    text = generate_text("abc", 50, 1)
    assert text.startswith(" ") and all(w.isalpha() and w.islower() for w in text.split())
    assert len(text.split()) == 50
    assert "".join(token_pieces(ids)) == text
    # re-tokenizing the output gives the same count (a client counting tokens agrees)
    assert len(encode(text)) == 50


def test_expected_chat_completion_matches_rendered_prompt() -> None:
    messages = [{"role": "user", "content": "[pdchaos:r:3] hi"}]
    assert expected_chat_completion(messages, 8, 3) == expected_completion(render_chat(messages), 8, 3)
    assert expected_chat_completion(messages, 8, 3) != expected_completion("[pdchaos:r:3] hi", 8, 3)


# The piecewise ASCII path must give the tokenizer's own answer: every ASCII character (control characters,
# whitespace runs, apostrophes of contractions, digits against letters) and the special tokens in between.
_ASCII_TEXT = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=24),
        st.sampled_from([*SPECIAL_TOKENS, " ", "  ", "\n \n", "'s", "'ll", "'re x", " 'd", "\t\t a"]),
        st.sampled_from(["12ab", "<|", "a\x1cb", "x\x0bz"]),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(_ASCII_TEXT)
def test_piecewise_ascii_encoding_equals_the_tokenizer(text: str) -> None:
    whole = load_tokenizer().encode(text, add_special_tokens=False).ids
    assert encode(text) == whole


def test_piecewise_encoding_on_prompts_and_non_ascii_fallback() -> None:
    tok = load_tokenizer()
    rng = random.Random(7)
    words = ["alpha", "river", "x'y", "it's", "42", "a1b2", "--", "(ok)", "\n", "  "]
    for n in range(300):
        text = f"[pdchaos:run-{n}:{n * 37}] " + " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        assert encode(text) == tok.encode(text, add_special_tokens=False).ids, text
    for text in ("café au lait", "中文 text", "x\u00a0y", "naïve's 12"):
        assert encode(text) == tok.encode(text, add_special_tokens=False).ids
