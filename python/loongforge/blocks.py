"""Compiled blocks for any model: torch.compile each repeated block in place.

Note [Repeated blocks]. A transformer's time between its GEMMs goes to norms, activations,
residual adds, rotary embeddings and autocast's casts, each a kernel of its own in eager PyTorch;
torch.compile fuses them into a few Triton kernels. Compiling the whole model costs minutes on a
large one and breaks on code it cannot trace; compiling each *block* costs one compilation per
kind of block, since every layer of a kind runs the same code (dynamo lifts a module's parameters
to graph inputs instead of specializing on them, ``inline_inbuilt_nn_modules``). A block is what
model code keeps in an ``nn.ModuleList`` of two or more modules of one class, the way
transformers, timm and LeRobot hold their layers; when lists nest (experts inside a layer) the
outermost is taken, so a block is compiled with everything it calls. Shapes are static
(``dynamic=False``): one graph per batch shape, compiled in that shape's eager warm-up steps,
whose Triton kernels the step's CUDA graph then captures like any other kernel.

The unit compiled is the *scope*: ``"block"`` (each block), ``"owner"`` (the module that holds
each outermost block list, compiled whole with its layers; Forge's default) or ``"model"`` (the
whole model). A larger unit costs more compile time and fuses across more code, and it puts the code
around the blocks inside the traced region: transformers builds its attention mask in the module
that owns the layers, and outside a trace it builds it one way in eager steps and another way
while a CUDA graph is captured, so a block compiled alone misses its guard at capture and runs
eager inside the graph, while a compiled owner traces the mask once (a SigLIP + Qwen3 policy on
an H200, bench/forge/hf_policy.py: 32.1 ms a step by block, 17.3 ms by owner).

The compiled ``forward`` is set on each module instance, so parameter names and state_dict keys
stay as they are; ``restore`` puts back what was there before.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

# Graphs per block kind that dynamo keeps before it falls back to eager: kinds of input (with and
# without grad, train and no_grad) times batch shapes, with room.
RECOMPILE_LIMIT = 64


def find_blocks(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """The repeated blocks of `model` (Note [Repeated blocks]): (name, module) of every element
    of an ``nn.ModuleList`` holding two or more modules of one class, outermost lists first and
    nothing inside a block already taken."""
    taken: List[str] = []
    out: List[Tuple[str, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) < 2:
            continue
        if any(name == t or name.startswith(t + ".") for t in taken):
            continue
        kinds = {type(m) for m in mod}
        if len(kinds) != 1 or isinstance(mod[0], torch.nn.ModuleList):
            continue
        for i, m in enumerate(mod):
            child = f"{name}.{i}" if name else str(i)
            out.append((child, m))
            taken.append(child)
    return out


SCOPES = ("block", "owner", "model")


def find_units(model: torch.nn.Module, scope: str = "block") -> List[Tuple[str, torch.nn.Module]]:
    """The modules compiled at `scope` (Note [Repeated blocks]): the blocks, the modules that
    own the outermost block lists (an owner inside another owner is left to the outer one; '' is
    the model itself), or the model alone. Empty when the model holds no block list."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: one of {', '.join(SCOPES)}")
    blocks = find_blocks(model)
    if scope == "block" or not blocks:
        return blocks
    if scope == "model":
        return [("", model)]
    owners: List[str] = []
    for name, _ in blocks:
        owner = name.rsplit(".", 2)[0] if name.count(".") >= 2 else ""
        if owner not in owners:
            owners.append(owner)
    outer = [o for o in owners
             if not any(p != o and (p == "" or o.startswith(p + ".")) for p in owners)]
    mods = dict(model.named_modules())
    return [(o, mods[o]) for o in outer]


def unavailable_reason() -> str:
    """Why torch.compile cannot run here ('' when it can)."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (needs torch >= 2)"
    return ""


def configure_dynamo() -> None:
    """Dynamo settings compiled blocks need: one graph serves every layer of a kind, and enough
    graphs per kind for every batch shape."""
    import torch._dynamo as dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), RECOMPILE_LIMIT))
    if hasattr(dynamo.config, "inline_inbuilt_nn_modules"):
        dynamo.config.inline_inbuilt_nn_modules = True


def compile_in_place(module: torch.nn.Module, backend: Any = "inductor") -> None:
    """Sets torch.compile(module.forward, dynamic=False) on the instance."""
    module.forward = torch.compile(module.forward, dynamic=False,  # type: ignore[method-assign]
                                   backend=backend)


class CompiledBlocks:
    """The repeated blocks of a model (or their owners, or the model: `scope`), compiled in place
    until ``restore()``."""

    def __init__(self, model: torch.nn.Module, backend: Any = "inductor",
                 scope: str = "block") -> None:
        why = unavailable_reason()
        if why:
            raise RuntimeError(why)
        self.scope = scope
        self.blocks = find_units(model, scope)
        self._saved: List[Tuple[torch.nn.Module, Any]] = []
        configure_dynamo()
        for _, m in self.blocks:
            self._saved.append((m, m.__dict__.get("forward")))
            compile_in_place(m, backend)

    def kinds(self) -> Dict[str, int]:
        """Blocks compiled, by class name, in model order."""
        out: Dict[str, int] = {}
        for _, m in self.blocks:
            out[type(m).__name__] = out.get(type(m).__name__, 0) + 1
        return out

    def describe(self) -> str:
        return ", ".join(f"{n} {k}" for k, n in self.kinds().items())

    def restore(self) -> None:
        """Puts back each block's forward as it was before (idempotent)."""
        for m, old in self._saved:
            if old is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = old  # type: ignore[method-assign]
        self._saved = []
