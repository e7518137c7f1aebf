"""CheckpointVault.export_safetensors(model_only=True): a trainer-shaped checkpoint exported as the
model's state dict, read back with the repo's safetensors reader and loaded with
load_state_dict (docs/ckpt.md, "Exporting the model alone")."""
import pytest
import torch
from torch import nn

from loongforge.ckpt import CheckpointVault
from loongforge.models.safetensors_io import read_safetensors


class Tiny(nn.Module):
    """Tied weights (head = emb), a transposed buffer view of proj.weight, int64 buffers."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.norm = nn.BatchNorm1d(4)
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.emb.weight
        self.register_buffer("proj_t", self.proj.weight.detach().t())

    def forward(self, ids):
        return self.head(self.proj(self.norm(self.emb(ids))))


def _trained(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.arange(8)).square().mean().backward()
    opt.step()
    return model, opt


def _save(tmp_path, state):
    v = CheckpointVault(str(tmp_path / "vault"), chunk_bytes=4096)
    v.save(3, state)
    v.wait()
    return v


# Guards the export a user loads: only the model's keys, prefix stripped, every tensor equal to
# the saved one (tied and transposed views included), and load_state_dict(strict) takes it.
def test_model_only_export_loads_into_the_model(tmp_path):
    model, opt = _trained()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    v = _save(tmp_path, {"step": 3, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "lr": float("nan")})
    out = tmp_path / "model.safetensors"
    v.export_safetensors(3, str(out), model_only=True)
    tensors, meta = read_safetensors(str(out))
    assert set(tensors) == set(want)
    assert meta == {"format": "pt"}
    for k, t in want.items():
        assert tensors[k].dtype == t.dtype and tensors[k].shape == t.shape, k
        assert torch.equal(tensors[k], t), k
    fresh = Tiny()
    assert not torch.equal(fresh.proj.weight, model.proj.weight)
    fresh.load_state_dict(tensors)  # strict: no key missing or unexpected
    for k, t in fresh.state_dict().items():
        assert torch.equal(t, want[k]), k

    # The default export keeps everything, under the chunk names.
    full = tmp_path / "all.safetensors"
    v.export_safetensors(3, str(full))
    names, meta = read_safetensors(str(full))
    assert meta["loongforge_step"] == "3"
    assert "__loongforge_meta__" in names and any(n.startswith("optimizer/") for n in names)


# Guards --strip-prefix: a DDP-wrapped model's "module." goes too; a prefix that selects nothing
# raises ValueError naming it (and the keys there are), writing no file.
def test_strip_prefix_and_bad_prefix(tmp_path):
    model, _ = _trained(1)
    sd = {"module." + k: t for k, t in model.state_dict().items()}
    v = _save(tmp_path, {"model": sd, "epoch": 2})
    out = tmp_path / "m.safetensors"
    v.export_safetensors(3, str(out), model_only=True, strip_prefix="model/module.")
    tensors, _ = read_safetensors(str(out))
    Tiny().load_state_dict(tensors)
    assert torch.equal(tensors["emb.weight"], model.emb.weight.detach())

    bad = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match=r"'net/'.*'model'"):
        v.export_safetensors(3, str(bad), model_only=True, strip_prefix="net/")
    assert not bad.exists()
    with pytest.raises(ValueError, match="model_only"):
        v.export_safetensors(3, str(bad), strip_prefix="model/")
    with pytest.raises(FileExistsError):  # an existing file is never replaced by export
        v.export_safetensors(3, str(out), model_only=True, strip_prefix="model/module.")
