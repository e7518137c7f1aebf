"""Tokenizers chosen at load time: the loader's ``tokenizer=`` option.

A batch always carries its task text (``task``); with ``tokenizer=`` the loader also gives token
ids computed from that text when the batch is handed out, so the same DB serves a policy with
any vocabulary without a repack. A tokenizer is one of:

* the name of a built-in tokenizer (``"byte-v1"``, what ``pack --tokenizer`` writes);
* the path of a Hugging Face ``tokenizer.json`` (or a directory holding one), read with the
  ``tokenizers`` library (GR00T's Qwen3, pi0's PaliGemma and SmolVLA's tokenizers ship one);
* any callable ``text -> sequence of int``.

Encodings are cached per distinct text (a robot dataset has few tasks), so tokenizing costs one
dict lookup per row after the first batch.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from . import _C


class LoadTimeTokenizer:
    """A tokenizer for the loader (module docstring): ``encode(text)``, ``vocab_size`` (None for a
    callable) and ``pad_id`` (the id padding positions hold; 0 unless the tokenizer names one)."""

    def __new__(cls, spec: Any) -> "LoadTimeTokenizer":
        if isinstance(spec, LoadTimeTokenizer):
            return spec  # already made (the trainer reads its vocabulary first)
        return super().__new__(cls)

    def __init__(self, spec: Any) -> None:
        if spec is self:
            return
        self.vocab_size: Optional[int] = None
        self.pad_id = 0
        self._cache: Dict[str, List[int]] = {}
        if callable(spec):
            self.name = getattr(spec, "__name__", type(spec).__name__)
            self._encode: Callable[[str], Sequence[int]] = spec
        elif isinstance(spec, (str, os.PathLike)) and not _looks_like_path(str(spec)):
            info = _C.tokenizer_info(str(spec))  # ValueError listing the built-in ones
            self.name, self.vocab_size, self.pad_id = info["id"], info["vocab_size"], info["pad_id"]
            self._encode = lambda text, _n=info["id"]: _C.tokenize(text, _n)
        elif isinstance(spec, (str, os.PathLike)):
            self._hf(os.fspath(spec))
        else:
            raise TypeError("tokenizer must be a built-in tokenizer's name, the path of a "
                            f"tokenizer.json or a callable, got {type(spec).__name__}")

    def _hf(self, path: str) -> None:
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"tokenizer: {file}: no such file (a Hugging Face "
                                    "tokenizer.json, or a directory holding one)")
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(f"tokenizer: reading {file} needs the 'tokenizers' package, which "
                              f"is not importable here ({e})") from e
        try:
            tok = tokenizers.Tokenizer.from_file(file)
        except Exception as e:  # the library raises its own exception types
            raise ValueError(f"tokenizer: {file} is not a readable tokenizer.json: {e}") from e
        self.name = file
        self.vocab_size = int(tok.get_vocab_size())
        pad = tok.padding["pad_id"] if tok.padding else None
        for name in ("<pad>", "[PAD]", "<|endoftext|>"):
            if pad is None:
                pad = tok.token_to_id(name)
        self.pad_id = int(pad or 0)
        self._encode = lambda text: tok.encode(text).ids

    def encode(self, text: str) -> List[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = [int(i) for i in self._encode(text)]
            if self.vocab_size is not None and any(not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"tokenizer {self.name}: an id of {text!r} is outside "
                                 f"[0, {self.vocab_size})")
            self._cache[text] = ids
        return ids

    def batch(self, texts: Sequence[str], rows_valid: torch.Tensor, pad_to: Optional[int],
              buckets: Sequence[int], truncate: bool, device: torch.device):
        """(tokens [B, L] int64, attention_mask [B, L] bool) of `texts`: padded to the longest
        (pad_to None and no buckets), to `pad_to`, or to the smallest bucket >= the longest.
        Rows where `rows_valid` is False (padding rows) are all padding. A text longer than the
        length is ValueError naming it, or is cut with `truncate`."""
        ids = [self.encode(t) if bool(v) else [] for t, v in zip(texts, rows_valid.tolist())]
        longest = max((len(x) for x in ids), default=0)
        if buckets:
            fit = [b for b in buckets if b >= longest]
            length = fit[0] if fit else buckets[-1]
        else:
            length = pad_to if pad_to else max(longest, 1)
        if longest > length and not truncate:
            text = next(t for t, x in zip(texts, ids) if len(x) > length)
            raise ValueError(f"tokenizer {self.name}: task {text!r} has {longest} tokens, more "
                             f"than the batch's length {length} (token_pad / token_buckets; "
                             "truncate_tokens=True cuts it)")
        tokens = torch.full((len(ids), length), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(ids), length), dtype=torch.bool)
        for r, x in enumerate(ids):
            x = x[:length]
            if x:
                tokens[r, :len(x)] = torch.tensor(x, dtype=torch.int64)
                mask[r, :len(x)] = True
        return tokens.to(device), mask.to(device)


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or spec.endswith(".json") or os.path.exists(spec)
