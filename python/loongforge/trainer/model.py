"""The policy the trainer fine-tunes: its config (with --set overrides) and a seed-determined
init, checked against the dataset's schema."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

import torch

from ..models.gr00t import Gr00tConfig, Gr00tPolicy, get_config
from .errors import TrainError


def parse_overrides(items: Sequence[str]) -> Dict[str, Any]:
    """'field=value' strings -> typed config overrides (ValueError naming a bad item)."""
    fields = {f.name: f.type for f in dataclasses.fields(Gr00tConfig)}
    out: Dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with a Gr00tConfig field")
        default = getattr(Gr00tConfig(), key)
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1")
            else:
                out[key] = type(default)(raw)
        except ValueError as e:
            raise ValueError(f"--set {item!r}: {key} takes a {type(default).__name__}") from e
    return out


def build_model(config: str, seed: int, image_size: Optional[int] = None,
                schema: Optional[Dict[str, Any]] = None,
                overrides: Optional[Dict[str, Any]] = None) -> Gr00tPolicy:
    """The policy with a seed-determined init (identical in both modes)."""
    cfg = get_config(config, image_size=image_size, **(overrides or {}))
    if schema is not None:
        if int(schema["state_dim"]) > cfg.max_state_dim or int(schema["action_dim"]) > cfg.max_action_dim:
            raise TrainError(f"dataset state/action dims {schema['state_dim']}/{schema['action_dim']}"
                             f" exceed config {config}'s {cfg.max_state_dim}/{cfg.max_action_dim}")
        if int(schema.get("vocab_size", 0)) > cfg.vocab_size:
            raise TrainError(f"dataset vocab {schema['vocab_size']} exceeds config {config}'s "
                             f"{cfg.vocab_size}")
        if int(schema["action_horizon"]) > cfg.max_seq_len - 1:
            raise TrainError(f"action horizon {schema['action_horizon']} too long for {config}")
    torch.manual_seed(seed)
    return Gr00tPolicy(cfg)
