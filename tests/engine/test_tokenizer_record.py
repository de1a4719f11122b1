"""The tokenizer a weight store carries for a GGUF model (kind "bpe": tokens and merges packed in
one string each) encodes and decodes exactly like the one built from the GGUF file; a record
that cannot be packed keeps the GGUF metadata, and a broken packed record is refused by name."""

from __future__ import annotations

import json

import pytest

from medusa.engine.loader import open_model
from medusa.engine.loader.tokenizer_record import (
    check_packed_tokenizer,
    packed_gguf_tokenizer,
    tokenizer_from_record,
)

TEXTS = [
    "Hello world 12345",
    "<|im_start|>user\nWhat's the capital of France?<|im_end|>\n",
    "ünïcödé  tabs\tand 🙂 emoji, 3.14159",
]


@pytest.fixture(scope="module")
def smollm2():
    return open_model()


def test_the_packed_record_tokenizes_like_the_gguf_file(smollm2):
    record = json.loads(json.dumps(smollm2.tokenizer_record()))  # as a store reads it back
    assert record["kind"] == "bpe"
    want, got = smollm2.tokenizer(), tokenizer_from_record(record, smollm2.path)
    for text in TEXTS:
        ids = want.encode(text)
        assert got.encode(text) == ids
        assert got.decode(ids) == want.decode(ids)
    assert (got.eos_ids, got.bos, got.eos) == (want.eos_ids, want.bos, want.eos)
    assert got.chat_template == want.chat_template
    assert got.vocab_size == want.vocab_size


def test_a_token_with_a_newline_keeps_the_gguf_metadata(smollm2):
    meta = dict(smollm2.file.metadata)
    meta["tokenizer.ggml.tokens"] = [*list(meta["tokenizer.ggml.tokens"])[:-1], "a\nb"]
    assert packed_gguf_tokenizer(meta) is None


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"eos": 10**9}, "special token id outside"),
        ({"control": [-1]}, "special token id outside"),
        ({"tokens": ["a", "b"]}, "not strings"),
        ({"chat_template": 3}, "chat_template"),
    ],
)
def test_a_broken_packed_record_is_refused(smollm2, change, reason):
    record = {**smollm2.tokenizer_record(), **change}
    with pytest.raises(ValueError, match=reason):
        check_packed_tokenizer(record)
