"""Tests of CheckpointVault(writer=...) (docs/ckpt.md, "Writer: POSIX or cuFile")."""
import glob
import os

import pytest
import torch

from loongforge import _C
from loongforge.ckpt import CheckpointVault

HAVE_CUFILE = bool(_C.build_info()["cufile"])


def _segment(vault_dir, step):
    (path,) = glob.glob(os.path.join(vault_dir, "segments", f"seg-{step:012d}-*"))
    with open(path, "rb") as f:
        return f.read()


# Guards the documented default: writer="auto" runs the POSIX writer and says so in stats().
def test_writer_auto_is_posix_with_reason(tmp_path):
    with CheckpointVault(str(tmp_path), chunk_bytes=4096) as v:
        v.save(1, {"w": torch.arange(5000, dtype=torch.float32)})
        v.wait()
        st = v.stats()
    assert st["writer"] == "posix" and "writer=auto" in st["writer_reason"]
    assert st["chunks_cufile"] == 0 and st["bytes_cufile"] == 0
    if not HAVE_CUFILE:
        assert "cufile: not built" in st["writer_reason"]


# Guards option validation: a bad writer is a ValueError naming the choices.
def test_writer_option_is_validated(tmp_path):
    with pytest.raises(ValueError, match="'auto' or 'posix' or 'cufile', got 'gds'"):
        CheckpointVault(str(tmp_path), writer="gds")


# Guards the clear error of writer="cufile" on a build without cuFile (no silent fallback).
@pytest.mark.skipif(HAVE_CUFILE, reason="cuFile is built in")
def test_writer_cufile_without_cufile_raises(tmp_path):
    with pytest.raises(RuntimeError, match="cufile: not built"):
        CheckpointVault(str(tmp_path), writer="cufile")


# Guards the cuFile writer from Python: CUDA tensors saved with writer="cufile" give the same
# segment bytes as writer="posix", load back exactly, and a fine-tune save writes only the
# changed chunks through cuFile.
@pytest.mark.skipif(not torch.cuda.is_available() or not HAVE_CUFILE, reason="needs CUDA and cuFile")
def test_cuda_cufile_writer_round_trip_matches_posix(tmp_path):
    try:  # Open probes cuFile in the vault's directory (CkptCufile.OpenFailsClearly... in C++)
        CheckpointVault(str(tmp_path / "probe"), writer="cufile").close()
    except RuntimeError as e:
        if "cuFile cannot write files in" not in str(e):
            raise
        pytest.skip(f"cuFile cannot write files on this machine: {e}")
    g = torch.Generator(device="cuda").manual_seed(7)
    state = {f"w{i}": torch.randn(262_144 + 1001 * i, generator=g, device="cuda") for i in range(4)}
    state["step"] = torch.tensor([3], dtype=torch.int64)  # a CPU tensor in the same segment
    dirs = {w: str(tmp_path / w) for w in ("posix", "cufile")}
    stats = {}
    for w, d in dirs.items():
        with CheckpointVault(d, chunk_bytes=1 << 16, device_staging="on", writer=w) as v:
            v.save(1, state)
            v.wait()
            stats[w, 1] = v.stats()
            state["w2"][100:200] += 1.0  # two chunks at most
            v.save(2, state)
            v.wait()
            stats[w, 2] = v.stats()
            out = v.load(2)
            for k, t in state.items():
                assert torch.equal(out[k].to(t.device), t), k
            state["w2"][100:200] -= 1.0  # back to step 1 for the next writer
    c1, c2 = stats["cufile", 1], stats["cufile", 2]
    assert c1["writer"] == "cufile" and c1["chunks_cufile"] > 0, c1["writer_reason"]
    assert "cuFileWrite" in c2["writer_reason"]
    assert 1 <= c2["chunks_cufile"] <= 2 and c2["chunks_written"] == c2["chunks_cufile"]
    assert stats["posix", 1]["chunks_cufile"] == 0
    for step in (1, 2):
        assert _segment(dirs["posix"], step) == _segment(dirs["cufile"], step)
