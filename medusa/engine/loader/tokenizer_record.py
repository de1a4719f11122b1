"""The tokenizer as a weight store keeps it, so that a restored start builds it without the model
file: a GGUF byte-level BPE packed (kind "bpe"), other GGUF metadata as it is (kind "gguf"), or a
Hugging Face tokenizer.json (kind "json")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from medusa.engine.tokenizer import Tokenizer, gguf_specials, merge_pairs, merges_paired

GGUF_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.chat_template",
)


def packed_gguf_tokenizer(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A GGUF byte-level BPE tokenizer as a store keeps it (kind "bpe"): tokens and merges as
    one newline-joined string each, which JSON parses in a few ms where 98k strings took 27 ms,
    and which split in C at start. None where a token or merge holds a newline (then the
    metadata is kept as it is)."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        return None
    tokens, merges = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.merges"])
    if any("\n" in t for t in tokens) or any("\n" in m for m in merges):
        return None
    return {"kind": "bpe", "tokens": "\n".join(tokens), "merges": "\n".join(merges),
            **gguf_specials(meta)}  # fmt: skip


def check_packed_tokenizer(r: dict[str, Any]) -> None:
    """ValueError unless a "bpe" record can build its tokenizer (cheap: nothing is split)."""
    if not (isinstance(r.get("tokens"), str) and isinstance(r.get("merges"), str)):
        raise ValueError("tokens and merges are not strings")
    n = r["tokens"].count("\n") + 1
    if not isinstance(r.get("control"), list):
        raise ValueError("control is not a list of token ids")
    ids = [r.get("eos"), *r["control"], *([] if r.get("bos") is None else [r["bos"]])]
    if not all(type(i) is int and 0 <= i < n for i in ids):
        raise ValueError(f"a special token id outside the {n} tokens")
    if not isinstance(r.get("chat_template"), (str, type(None))):
        raise ValueError("chat_template is not a string")
    if r["merges"] and not merges_paired(r["merges"]):  # merge_pairs' own rule
        raise ValueError("a merge that is not two tokens apart by one space")


def tokenizer_from_record(r: dict[str, Any], path: Path) -> Tokenizer:
    if r["kind"] == "bpe":
        return Tokenizer.byte_level_bpe(
            r["tokens"].split("\n"), merge_pairs(r["merges"], path), r["control"], r["eos"],
            r["bos"], r["chat_template"],
        )  # fmt: skip
    if r["kind"] == "gguf":
        return Tokenizer.from_gguf(r["metadata"], path)
    return Tokenizer(HFTokenizer.from_str(r["json"]), tuple(r["eos_ids"]), r["chat_template"],
                     r["bos"], r["eos"])  # fmt: skip
