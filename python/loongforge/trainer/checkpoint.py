"""Checkpoints: ``Checkpointer`` (torch.save, an async save, or CheckpointVault, with the
checkpoint directory's identity and every rank's own state in one checkpoint per step) and the
RNG states a checkpoint holds. Used by the trainer and by ``loongforge.Forge``."""
from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from .dist import Dist
from .errors import TrainError, _missing


class Checkpointer:
    """torch.save (baseline / --no-vault) or CheckpointVault. ``stall_s``: time training blocked.

    Rank 0 writes the shared state (model, optimizer, scheduler) and every rank's own small state
    (loader position, RNG) in one checkpoint per step (Note [One checkpoint per step])."""

    SHARED = ("step", "model", "optimizer", "scheduler", "config")
    RUN_FILE = "run.json"  # which run wrote this directory (Note [Checkpoint directory identity])
    RANK_KEY = "__rank_state__"  # {"rank00000": that rank's own state, ...} inside a checkpoint

    WHEN_BUSY = ("skip", "wait")

    def __init__(self, kind: str, directory: Optional[str], d: Dist,
                 run_id: Optional[Dict[str, Any]] = None, when_busy: str = "skip",
                 log: Optional[Callable[[str], None]] = None, resume: bool = False) -> None:
        if when_busy not in self.WHEN_BUSY:
            raise TrainError(f"--ckpt-when-busy must be skip or wait, got {when_busy!r}")
        self.kind, self.dir, self.d = kind, directory, d
        self.when_busy = when_busy
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.vault: Any = None
        self.pending: Any = None  # async save in flight (tuned mode)
        self.async_impl = ""
        self.stall_s = 0.0
        self.drain_s = 0.0
        self.bytes_written = 0
        # Per committed save: step, bytes_written, durable_s (save() call to commit), blocking_s,
        # wait_s, snapshot_path (Note [When the disk cannot keep up]).
        self.saves: List[Dict[str, Any]] = []
        self.skipped: List[int] = []
        self._queued: Optional[Tuple[int, float]] = None  # (step, time) of the newest vault save
        self._blocking: Dict[int, Dict[str, Any]] = {}  # step -> Save()'s own figures
        self._row: Dict[str, Any] = {}
        self.run_id = dict(run_id or {}, checkpoint=kind)
        self.resume = resume
        if directory:
            self._claim(directory)
        if kind == "vault" and directory and d.is_main:
            try:
                from ..ckpt import CheckpointVault
            except ImportError as e:
                raise _missing("CheckpointVault (loongforge.ckpt)", "vault", e) from e
            self.vault = CheckpointVault(os.path.join(directory, "vault"))

    # Note [Checkpoint directory identity]. A checkpoint directory belongs to one kind of run:
    # its mode, checkpoint format, model config and the figures the saved state depends on (batch
    # size and world size fix the loader position, the seed its order). DIR/run.json records them
    # at the first use; a later run that differs stops before it writes anything, naming the
    # fields, so that it neither resumes from state it cannot use (or silently restarts at step
    # 1) nor overwrites that run's rank_state/. Directories from before run.json are identified
    # by their files (vault/, step_*.pt, *.dcp).
    def _claim(self, directory: str) -> None:
        run_file = os.path.join(directory, self.RUN_FILE)
        theirs: Optional[Dict[str, Any]] = None
        if os.path.exists(run_file):
            try:
                with open(run_file) as f:
                    theirs = json.load(f)
            except (OSError, ValueError) as e:
                raise TrainError(f"--ckpt-dir {directory}: unreadable {self.RUN_FILE} ({e}); "
                                 "use another directory") from e
        elif os.path.isdir(directory):
            found = self._formats_in(directory)
            wants = ({"vault"} if self.kind == "vault" else
                     {"torch.save", "DCP"} if self.kind == "async" else {"torch.save"})
            if found - wants:
                raise TrainError(f"--ckpt-dir {directory} holds {' and '.join(sorted(found))} "
                                 f"checkpoints of another run; this run ({self.run_id.get('mode')}"
                                 f" mode) writes {' or '.join(sorted(wants))} checkpoints: use "
                                 "another directory")
        if theirs is not None:
            diff = [k for k in sorted(set(theirs) | set(self.run_id))
                    if theirs.get(k) != self.run_id.get(k)]
            if diff:
                what = ", ".join(f"{k} {theirs.get(k)!r} (this run: {self.run_id.get(k)!r})"
                                 for k in diff)
                raise TrainError(f"--ckpt-dir {directory} belongs to another run: {what}; "
                                 "use another directory")
        # A new run would train until its first save and then collide with the steps there (or
        # mix its checkpoints with theirs): refused before training.
        if not self.resume and os.path.isdir(directory) and self._has_checkpoints(directory):
            raise TrainError(f"--ckpt-dir {directory} already holds checkpoints of a run: pass "
                             "--resume to continue it, or pick another --ckpt-dir")
        if theirs is not None:
            return
        if self.d.is_main:
            os.makedirs(directory, exist_ok=True)
            tmp = f"{run_file}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(self.run_id, f, indent=1, sort_keys=True)
            os.replace(tmp, run_file)

    @staticmethod
    def _has_checkpoints(directory: str) -> bool:
        manifests = os.path.join(directory, "vault", "manifests")
        if os.path.isdir(manifests) and any(n.endswith(".manifest") for n in os.listdir(manifests)):
            return True
        return bool(Checkpointer._formats_in(directory) - {"vault"})

    @staticmethod
    def _formats_in(directory: str) -> set:
        names = os.listdir(directory)
        found = set()
        if "vault" in names:
            found.add("vault")
        if any(n.startswith("step_") and n.endswith(".pt") for n in names):
            found.add("torch.save")
        if any(n.endswith(".dcp") for n in names):
            found.add("DCP")
        return found

    def _rank_path(self, step: int) -> str:
        """Where runs before Note [One checkpoint per step] kept a rank's own state."""
        return os.path.join(self.dir, "rank_state", f"rank{self.d.rank:05d}_step_{step:08d}.pt")

    # Note [One checkpoint per step]
    # A resume needs the shared state and every rank's own state (loader position, RNG states,
    # expert shard) of one step. They are one artefact, so that a committed checkpoint is always
    # complete (a kill between two files cannot leave a step without its rank state): rank 0
    # gathers the ranks' own states (a collective on every requested save) and stores them under
    # RANK_KEY inside the vault commit, or inside the one step_*.pt file (written to a temporary
    # file, fsynced, renamed, the directory fsynced). Both hold data only: the vault's structure
    # is JSON (Note [The checkpoint structure] in ckpt.py) and the .pt files are read with
    # torch.load(weights_only=True).
    def _gather_rank_states(self, mine: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Every rank's own state on rank 0 ({"rank00000": ..., ...}), None on the others."""
        if self.d.world == 1:
            return {f"rank{self.d.rank:05d}": mine}
        import io

        buf = io.BytesIO()
        torch.save(_as_data(mine), buf)
        raw = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(self.d.device)
        n = torch.tensor([raw.numel()], dtype=torch.int64, device=self.d.device)
        sizes = [torch.zeros_like(n) for _ in range(self.d.world)]
        dist.all_gather(sizes, n)
        width = max(int(x.item()) for x in sizes)
        padded = torch.zeros(width, dtype=torch.uint8, device=self.d.device)
        padded[:raw.numel()] = raw
        parts = [torch.empty_like(padded) for _ in range(self.d.world)]
        dist.all_gather(parts, padded)
        if not self.d.is_main:
            return None
        out = {}
        for r, (part, size) in enumerate(zip(parts, sizes)):
            data = part[:int(size.item())].cpu().numpy().tobytes()
            out[f"rank{r:05d}"] = self._load_data(io.BytesIO(data))
        return out

    @staticmethod
    def _write_atomic(obj: Any, path: str) -> int:
        """torch.save to a temporary file, fsync, rename over `path`, fsync the directory."""
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            torch.save(_as_data(obj), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.path.getsize(path)

    @staticmethod
    def _load_data(f: Any) -> Any:
        """A state written by _as_data, read with torch.load(weights_only=True): the file holds
        tensors and strings only, so no file can name a function to call, and torch < 2 (whose
        weights-only reader refuses floats, every optimizer's lr among them) reads it too."""
        doc = torch.load(f, map_location="cpu", weights_only=True)
        return _from_data(doc)

    def _load_pt(self, path: str) -> Any:
        try:
            return self._load_data(path)
        except Exception as e:  # pickle.UnpicklingError, RuntimeError, EOFError, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainError(f"--resume: {path} is not a loongforge checkpoint of data only "
                             f"({type(e).__name__}: {first[:200]})") from None

    # Note [When the disk cannot keep up]
    # A save blocks the step for (Note [When the writer is busy] in src/ckpt/snapshot.cc): the
    # caller's state_dict() calls and this method's small per-rank torch.save; the vault's
    # flattening in Python; waiting for the previous save's write (back-pressure, max_inflight
    # 1: every chunk of a training state changes, so each save writes the whole state, 26 GB for
    # n16 + AdamW, longer at disk speed than 100 steps); and the snapshot itself (device staging:
    # a device-to-device copy; the first save also allocates the arena). The back-pressure is
    # the only part that grows with the cadence, and it is a choice (--ckpt-when-busy):
    #   skip (default): a save requested while the previous one is still being written is not
    #     taken (nothing flattened; with one rank the state is not even built); the log names
    #     the step and how
    #     far behind the writer is, and the summary counts it. The committed checkpoints and the
    #     save in flight are untouched, so a kill loses at most the steps since the newest commit.
    #   wait: today's back-pressure; every requested step is saved, the step stalls meanwhile.
    # With several ranks every rank builds its own state and joins the gather on every
    # requested step (Note [One checkpoint per step]); rank 0 then decides whether to skip.
    # Per save the summary and the metrics rows report bytes written and durable time (save()
    # call to the manifest commit), from the vault's committed stats.
    def save(self, step: int, state: Union[Dict[str, Any], Callable[[], Dict[str, Any]]],
             model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Writes `state` (its SHARED keys on rank 0, the rest on every rank). `state` may be a
        function that builds it: it is then called only when the save happens (not for a skipped
        one), and its time counts in the stall. `model` and `optimizer` are the live objects,
        which DCP's async_save reads (tuned mode). Returns the time it blocked."""
        if not self.dir:
            return 0.0
        t = time.perf_counter()
        # With one rank the skip is decided before the state is built; with more, every rank
        # takes part in the gather first (rank 0 alone sees its writer).
        if (self.d.world == 1 and self.vault is not None and self.when_busy == "skip"
                and self.vault.busy()):
            self._skip(step, t)
            dt = time.perf_counter() - t
            self.stall_s += dt
            return dt
        if callable(state):
            state = state()
        t_state = time.perf_counter()
        shared = {k: v for k, v in state.items() if k in self.SHARED}
        ranks = self._gather_rank_states({k: v for k, v in state.items() if k not in self.SHARED})
        if self.d.is_main:
            shared[self.RANK_KEY] = ranks
        if (self.d.is_main and self.kind == "vault" and self.when_busy == "skip"
                and self.vault.busy()):
            self._skip(step, t)
        elif self.d.is_main:
            if self.kind == "vault":
                t_vault = time.perf_counter()
                # Blocks only for the snapshot, plus (wait) the previous write. Not busy was
                # checked above and only the writer changes it back, so skip never waits here.
                if self.when_busy == "skip" and not self.vault.try_save(step, shared):
                    self._skip(step, t)
                else:
                    if self.when_busy == "wait":
                        self.vault.save(step, shared)
                    self._queued = (step, t)
                    st = self.vault.stats()
                    # Where save() spent its time: building the state (Python), the vault's
                    # flatten and tensor conversion, and the C++ snapshot's phases.
                    self._blocking[step] = {k: st.get(k) for k in (
                        "blocking_s", "wait_s", "prepare_s", "snapshot_s", "stage_s", "hash_s",
                        "copy_s", "staging_allocated", "snapshot_path", "snapshot_reason")}
                    self._blocking[step].update(
                        state_s=t_state - t, vault_call_s=time.perf_counter() - t_vault)
            elif self.kind == "async":
                self._save_async(step, shared, model, optimizer)
            else:
                size = self._write_atomic(shared, os.path.join(self.dir, f"step_{step:08d}.pt"))
                self.bytes_written += size
                self._committed({"step": step, "bytes_written": size,
                                 "durable_s": time.perf_counter() - t})
        dt = time.perf_counter() - t
        self.stall_s += dt
        return dt

    def prepare(self, state: Dict[str, Any]) -> None:
        """Before the first save (after the first optimizer step, so that the optimizer's state
        exists): reserves the vault's device staging for `state`, so that no save allocates its
        arena inside a step (cudaMalloc of the whole state: ~50 ms for n16)."""
        if not self.dir or self.vault is None or not self.d.is_main:
            return
        shared = {k: v for k, v in state.items() if k in self.SHARED}
        nbytes, why = self.vault.reserve_device_staging(shared)
        if nbytes:
            self.log(f"[ckpt] device staging reserved: {nbytes / 2**30:.1f} GiB on the GPU "
                     "(outside torch's allocator; saves copy the state there and return)")
        elif why and self.d.device.type == "cuda":
            self.log(f"[ckpt] no device staging reserved: {why}")

    def _skip(self, step: int, t: float) -> None:
        self.skipped.append(step)
        self._row["ckpt_skipped"] = 1
        q = self._queued
        behind = (f"the writer is still writing step {q[0]} ({step - q[0]} steps, "
                  f"{t - q[1]:.1f} s ago)" if q else "the writer is still busy")
        self.log(f"[ckpt] step {step}: checkpoint skipped, {behind}; the newest committed "
                 f"checkpoint stays the latest (--ckpt-when-busy wait would stall instead)")

    def _committed(self, rec: Dict[str, Any]) -> None:
        self.saves.append(rec)
        self._row.update({"ckpt_committed_step": rec["step"],
                          "ckpt_bytes_written": rec["bytes_written"],
                          "ckpt_durable_s": rec["durable_s"]})

    def _poll(self) -> None:
        """Collects the vault saves committed since the last call (cheap: one locked copy)."""
        if self.vault is None:
            return
        for st in self.vault.committed_stats():
            step = int(st["step"])
            rec = {"step": step, "bytes_written": int(st["bytes_written"]),
                   "durable_s": float(st["durable_s"]), "write_s": float(st["write_s"])}
            rec.update(self._blocking.pop(step, {}))
            self.bytes_written += rec["bytes_written"]
            self._committed(rec)

    def row_fields(self) -> Dict[str, Any]:
        """Checkpoint fields of this step's metrics row: ckpt_skipped (a requested save was
        skipped), and, in the row of the step that saw a save commit, ckpt_committed_step,
        ckpt_bytes_written and ckpt_durable_s."""
        self._poll()
        row, self._row = self._row, {}
        return row

    def figures(self) -> Dict[str, Any]:
        """Summary figures: per committed save (bytes written, durable time), skipped saves."""
        dur = [s["durable_s"] for s in self.saves]
        nbytes = [s["bytes_written"] for s in self.saves]
        paths = sorted({str(s["snapshot_path"]) for s in self.saves if s.get("snapshot_path")})
        return {"ckpt_when_busy": self.when_busy,
                "ckpt_saves_committed": len(self.saves),
                "ckpt_saves_skipped": len(self.skipped),
                "ckpt_skipped_steps": list(self.skipped),
                "ckpt_durable_s_mean": sum(dur) / len(dur) if dur else float("nan"),
                "ckpt_durable_s_max": max(dur) if dur else float("nan"),
                "ckpt_bytes_per_save_mean": sum(nbytes) / len(nbytes) if nbytes else float("nan"),
                "ckpt_snapshot_path": ",".join(paths),
                "ckpt_per_save": list(self.saves)}

    def _save_async(self, step: int, shared: Dict[str, Any], model: torch.nn.Module,
                    opt: torch.optim.Optimizer) -> None:
        """Tuned PyTorch: DCP async_save where torch has it, else a CPU snapshot written by a
        background thread with torch.save. A save waits for the previous one first."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        path = os.path.join(self.dir, f"step_{step:08d}")
        try:
            import torch.distributed.checkpoint as dcp

            if hasattr(dcp, "async_save"):
                from torch.distributed.checkpoint.state_dict import get_state_dict

                msd, osd = get_state_dict(model, opt)
                self.pending = dcp.async_save({"model": msd, "optimizer": osd,
                                               "step": torch.tensor(step)},
                                              checkpoint_id=path + ".dcp")
                self.async_impl = "dcp.async_save"
                return
        except Exception as e:  # DCP unusable here (version, no process group): fall back
            self.async_impl = f"thread torch.save (DCP failed: {type(e).__name__})"
        import concurrent.futures

        snap = _to_cpu(shared)
        if not self.async_impl:
            self.async_impl = "thread torch.save"
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

        def write() -> None:
            self._write_atomic(snap, path + ".pt")

        self.pending = pool.submit(write)
        pool.shutdown(wait=False)

    def latest(self) -> Optional[Dict[str, Any]]:
        if not self.dir or not os.path.isdir(self.dir):
            return None
        if self.kind == "vault":
            # Every rank reads the vault (read-only on ranks > 0).
            from .. import DataLossError
            from ..ckpt import CheckpointVault

            v = self.vault or CheckpointVault(os.path.join(self.dir, "vault"), read_only=True)
            step = v.latest()
            try:
                shared = v.load(step, map_location="cpu") if step is not None else None
            except DataLossError as e:  # names the vault and the step
                raise TrainError(f"--resume: {str(e).strip().splitlines()[0]}") from None
        else:
            if any(f.endswith(".dcp") for f in os.listdir(self.dir)):
                raise TrainError(f"{self.dir} holds DCP checkpoints; --resume reads torch.save "
                                 "checkpoints only (load DCP ones with torch.distributed.checkpoint)")
            files = sorted(f for f in os.listdir(self.dir) if f.startswith("step_") and
                           f.endswith(".pt"))
            where = os.path.join(self.dir, files[-1]) if files else ""
            shared = self._load_pt(where) if files else None
        if shared is None:
            return None
        if not isinstance(shared, dict) or not isinstance(shared.get("step"), int):
            raise TrainError(f"--resume: the latest checkpoint in {self.dir} has no integer "
                             "'step'")
        step = int(shared["step"])
        ranks = shared.pop(self.RANK_KEY, None)
        key = f"rank{self.d.rank:05d}"
        if ranks is None:
            # Written before the rank state moved inside the checkpoint: its own file, read as
            # data only (files whose RNG state holds numpy arrays are refused, naming the file).
            rank_file = self._rank_path(step)
            if not os.path.exists(rank_file):
                raise TrainError(f"--resume: checkpoint step {step} in {self.dir} holds no rank "
                                 f"state and {rank_file} is missing")
            mine = self._load_pt(rank_file)
            where = rank_file
        elif not isinstance(ranks, dict) or not isinstance(ranks.get(key), dict):
            raise TrainError(f"--resume: checkpoint step {step} in {self.dir} holds no state for "
                             f"rank {self.d.rank} (saved by {len(ranks or {})} ranks)")
        else:
            mine = ranks[key]
            where = f"checkpoint step {step} in {self.dir}"
        if not isinstance(mine, dict):
            raise TrainError(f"--resume: {where}: rank {self.d.rank}'s state is a "
                             f"{type(mine).__name__}, not a dict")
        shared.update(mine)
        return shared

    def close(self) -> None:
        if self.pending is not None:
            t = time.perf_counter()
            self.pending.result()
            self.pending = None
            self.drain_s = time.perf_counter() - t
        if self.vault is not None:
            t = time.perf_counter()
            self.vault.close()  # drains the background writer
            self.drain_s = time.perf_counter() - t
            # The saves the drain committed (bytes_written: the sum over committed saves; it was
            # the last save's figure only).
            self._poll()


# A .pt file's layout: the state's structure as the vault's JSON (Note [The checkpoint
# structure] in ckpt.py) in a uint8 tensor, and its tensors by name. torch.save writes it as the
# baseline users' torch.save writes their states (the same tensors, one file), and it holds no
# Python value a weights-only reader could refuse.
_STRUCTURE_KEY = "loongforge_structure"


def _as_data(obj: Any) -> Dict[str, Any]:
    from ..ckpt import _encode_state

    raw, tensors = _encode_state(obj)
    return {_STRUCTURE_KEY: torch.frombuffer(bytearray(raw), dtype=torch.uint8),
            "tensors": dict(tensors)}


def write_state_file(obj: Any, path: str) -> int:
    """Writes `obj` (tensors, numpy arrays, containers, numbers, str, bytes) to the .pt file
    `path` atomically (Checkpointer._write_atomic); returns its size in bytes."""
    return Checkpointer._write_atomic(obj, path)


def read_state_file(path: str) -> Any:
    """The state write_state_file wrote to `path`, tensors on the CPU; reads data only."""
    return Checkpointer._load_data(path)


def _from_data(doc: Any) -> Any:
    """The state _as_data wrote. ValueError naming what is wrong for anything else."""
    from ..ckpt import _decode, _parse_structure, _refs

    if not isinstance(doc, dict) or set(doc) != {_STRUCTURE_KEY, "tensors"}:
        raise ValueError(f"not a loongforge state (expected the keys {_STRUCTURE_KEY!r} and "
                         "'tensors'; written by another program or an older loongforge)")
    raw, tensors = doc[_STRUCTURE_KEY], doc["tensors"]
    if (not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.dim() != 1
            or not isinstance(tensors, dict)
            or not all(isinstance(t, torch.Tensor) for t in tensors.values())):
        raise ValueError(f"its {_STRUCTURE_KEY!r} is not a byte tensor or its 'tensors' not a "
                         "dict of tensors")
    root = _parse_structure(raw.numpy().tobytes())
    refs: Dict[str, Any] = {}
    _refs(root, "", refs)
    missing = sorted(set(refs) - set(tensors))
    if missing:
        raise ValueError(f"its structure names {len(missing)} tensor(s) the file lacks "
                         f"(first: {missing[0]!r} at {refs[missing[0]][0] or '/'})")
    return _decode(root, "", tensors)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def rng_state(gen: torch.Generator) -> Dict[str, Any]:
    """The RNG states as tensors, ints and floats only, so that both checkpoint formats hold
    them as data (torch.load(weights_only=True) takes no numpy arrays)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    st = {"torch": torch.get_rng_state(),
          "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                    "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
          "python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64),
                     "gauss_next": gauss_next},
          "noise": gen.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any], gen: torch.Generator) -> None:
    try:
        n, p = st["numpy"], st["python"]
        torch.set_rng_state(st["torch"])
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), int(n["pos"]),
                             int(n["has_gauss"]), float(n["cached_gaussian"])))
        random.setstate((int(p["version"]), tuple(int(x) for x in p["state"].tolist()),
                         p["gauss_next"]))
        gen.set_state(st["noise"])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise TrainError(f"--resume: the checkpoint's RNG state is malformed ({type(e).__name__}:"
                         f" {e})") from None
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
