"""DataFusionLoader.dataset: map-style access to the same samples the batches hold."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import loongforge  # noqa: E402
# The DBs and the loader settings of test_data.py: the same samples, read map-style here.
from test_data import _loader, bad_db, db  # noqa: E402,F401


def _assert_row_equals(batch, row, item):
    assert set(item) == set(batch)
    for k, v in batch.items():
        assert item[k].dtype == v.dtype and item[k].device == v.device, k
        assert item[k].shape == v[row].shape, k
        assert torch.equal(item[k], v[row]), f"{k} of sample {int(batch['sample_index'][row])}"


# Guards the contract of dataset[i]: every row of every batch of an epoch, with random crops and
# colour jitter on, is bit for bit dataset.sample(sample_index, epoch), keys/dtypes/shapes
# included; with a fixed token_pad the token arrays have the batch's shape too.
@pytest.mark.parametrize("epoch", [0, 1])
def test_rows_equal_dataset_items(db, epoch):
    ld = _loader(db, color_jitter=True, token_pad=8)
    ds = ld.dataset
    assert len(ds) == 24
    ld.set_epoch(epoch)
    seen = 0
    for b in ld:
        for row, i in enumerate(b["sample_index"].tolist()):
            item = ds.sample(i, epoch) if epoch else ds[i]
            _assert_row_equals(b, row, item)
            assert item["sample_index"].ndim == 0 and int(item["sample_index"]) == i
            seen += 1
    assert seen == 24


# Guards padding "as a batch of one": without token_pad an item's tokens are its own length, and
# they agree with the batch row where the masks are on.
def test_item_tokens_padded_as_batch_of_one(db):
    ld = _loader(db)
    ds = ld.dataset
    b = next(iter(ld))
    for row, i in enumerate(b["sample_index"].tolist()):
        item = ds[i]
        n = int(b["attention_mask"][row].sum())
        assert item["tokens"].shape == (n,) and bool(item["attention_mask"].all())
        assert torch.equal(item["tokens"], b["tokens"][row, :n])
        assert torch.equal(item["images"], b["images"][row])


# Guards determinism: the same index gives the same sample whatever was read before it, epochs
# differ (random crops) and augmentation follows the index, not the order of reads.
def test_items_deterministic(db):
    ds = _loader(db, color_jitter=True).dataset
    a = ds[5]
    for i in (6, 7, 2, 23, 0):
        ds[i]
    b = ds[5]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not torch.equal(ds.sample(5, 1)["images"], a["images"])
    assert torch.equal(ds[-1]["images"], ds[23]["images"])
    # A second loader with the same seed gives the same items; another seed other crops.
    assert torch.equal(_loader(db, color_jitter=True).dataset[5]["images"], a["images"])
    other = loongforge.DataFusionLoader(db, 4, seed=4, image_size=32, color_jitter=True)
    assert not torch.equal(other.dataset[5]["images"], a["images"])


# Guards the index space: all samples of the DB whatever the rank's share, IndexError naming the
# index and the length.
def test_index_errors_and_ranks(db):
    ds = _loader(db, rank=1, world_size=2).dataset
    assert len(ds) == 24
    assert int(ds[0]["sample_index"]) == 0
    with pytest.raises(IndexError, match=r"index 24 .*24 samples"):
        ds[24]
    with pytest.raises(IndexError, match=r"index -25 .*24 samples"):
        ds[-25]
    with pytest.raises(TypeError):
        ds["3"]
    # The C++ bound, past Python's check.
    with pytest.raises(IndexError, match="sample 30 .*24 samples"):
        _loader(db)._impl.get_sample(30)


# Guards corrupt samples: an index never silently gives nothing, whatever on_corrupt says, and
# the loader goes on serving the others.
def test_corrupt_item_raises(bad_db):
    ds = _loader(bad_db, on_corrupt="skip").dataset
    assert int(ds[4]["sample_index"]) == 4
    with pytest.raises(loongforge.DataLossError, match="00000005_cam_cam"):
        ds[5]
    assert int(ds[6]["sample_index"]) == 6


# Guards that items are the caller's: they stay valid after the loader is gone, and after close()
# the view refuses.
def test_items_owned_and_closed(db):
    ld = _loader(db)
    item = ld.dataset[3]
    ref = item["images"].clone()
    ld.close()
    with pytest.raises(RuntimeError, match="closed"):
        ld.dataset[3]
    del ld
    assert torch.equal(item["images"], ref)


# Guards the sampler use: torch's DataLoader over the map view, with a sampler of one's own and
# its default collate, gives the loader's rows of those samples (token_pad: equal lengths).
def test_torch_dataloader_over_the_view(db):
    ld = _loader(db, token_pad=8)
    order = [7, 3, 3, 20, 0, 11]
    dl = torch.utils.data.DataLoader(ld.dataset, batch_size=3, sampler=order)
    got = list(dl)
    assert [b["sample_index"].tolist() for b in got] == [order[:3], order[3:]]
    rows = {}
    for b in ld:
        for r, i in enumerate(b["sample_index"].tolist()):
            rows[i] = {k: v[r] for k, v in b.items()}
    for b in got:
        for r, i in enumerate(b["sample_index"].tolist()):
            for k in ("images", "tokens", "attention_mask", "state", "action", "action_mask"):
                assert torch.equal(b[k][r], rows[i][k]), (i, k)
