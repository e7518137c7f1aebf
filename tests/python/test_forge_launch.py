"""Forge at world sizes 2 and 4: real CPU ranks (gloo) started by `python -m loongforge.launch`,
each initialising its model with its own seed. After setup every rank holds rank 0's parameters
and buffers; K steps on the ranks' shares of each global batch give the losses (all-reduced mean)
and parameters of one rank training on the whole global batches; a checkpoint saved by the two
ranks resumes at world 2 and is refused at world 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import loongforge as lf  # noqa: E402
from lf_testdb import has_datafusion  # noqa: E402
from test_forge import Policy, make_batches  # noqa: E402

STEPS, GLOBAL_ROWS = 4, 8

# Each rank: its own seed, half of every global batch, the loss averaged over ranks.
SCRIPT = r"""
import json, os, sys
import torch, torch.distributed as dist
sys.path.insert(0, {here!r})
import loongforge as lf
from test_forge_launch import mean_loss, policy_and_optimizer, global_batches, flat_state

out, mode = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if mode == "db":  # forge.loader over a packed DB: this rank's shard of one epoch
    forge = lf.Forge(device="cpu")
    loader = forge.loader(sys.argv[3], batch_size=2, image_size=16, seed=5, threads=1)
    seen = [int(i) for b in loader for i in b["sample_index"]]
    forge.close()
    with open(os.path.join(out, f"db_rank{{rank}}.json"), "w") as f:
        json.dump({{"seen": seen, "batches": len(loader)}}, f)
    sys.exit(0)
model, opt = policy_and_optimizer(seed=100 + rank)
before = flat_state(model)
forge = lf.Forge(device="cpu", ckpt_dir=os.path.join(out, "ck"))
forge.setup(model, opt)
rows = {rows} // world
shards = [{{k: v[rank * rows:(rank + 1) * rows] for k, v in b.items()}}
          for b in global_batches()]
loader = forge.loader(shards)
step = forge.compile_step(mean_loss, clip=1.0)
start = 0
if mode == "resume":
    start = forge.load()["step"]
setup_state = flat_state(model)
losses = []
for i, batch in enumerate(loader, start=start):
    loss = step(batch).detach().clone()
    dist.all_reduce(loss)
    losses.append(float(loss / world))
    if mode == "fresh" and i + 1 == 2:
        forge.save(2)
rep = forge.report()
forge.close()
with open(os.path.join(out, f"{{mode}}_rank{{rank}}.json"), "w") as f:
    json.dump({{"before": before, "setup": setup_state, "after": flat_state(model),
               "losses": losses, "steps": rep["steps"], "world": rep["world_size"]}}, f)
"""


def policy_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = Policy(dropout=0.0)  # dropout would draw different masks on each rank
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    return model, opt


def mean_loss(model, batch):
    """A mean over rows: the mean over two equal shards is the mean over the whole batch."""
    pred = model(batch["images"], batch["state"])
    return (pred - batch["action"]).pow(2).mean()


def global_batches():
    return make_batches(STEPS, rows=GLOBAL_ROWS, seed=7)


def flat_state(model):
    """Every parameter and buffer as a list of floats (JSON keeps them exactly)."""
    return {k: v.detach().double().flatten().tolist() for k, v in model.state_dict().items()}


def _launch(tmp_path, mode, *extra, nproc=2):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(here=HERE, rows=GLOBAL_ROWS))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "loongforge.launch", "--nproc", str(nproc), "--",
                        str(script), str(tmp_path), mode, *extra], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads((tmp_path / f"{mode}_rank{i}.json").read_text()) for i in range(nproc)]


def _one_rank_reference():
    """The same steps on one rank with the global batch: losses and the final state."""
    torch.set_num_threads(1)
    model, opt = policy_and_optimizer(seed=100)
    forge = lf.Forge(device="cpu")
    forge.setup(model, opt)
    step = forge.compile_step(mean_loss, clip=1.0)
    ref = [float(step(b)) for b in forge.loader(global_batches())]
    forge.close()
    return ref, flat_state(model)


def _assert_matches_one_rank(rank0, ref, ref_state):
    for i, (a, b) in enumerate(zip(rank0["losses"], ref)):
        assert abs(a - b) <= 1e-5 * abs(b), (i, a, b)
    for k, v in ref_state.items():
        torch.testing.assert_close(torch.tensor(rank0["after"][k]), torch.tensor(v),
                                   rtol=1e-5, atol=1e-6, msg=k)


def test_two_ranks_match_one_rank_on_the_global_batch(tmp_path):
    ranks = _launch(tmp_path, "fresh")
    # The ranks started from different weights and buffers; setup made them rank 0's.
    assert ranks[0]["before"]["cnn.0.weight"] != ranks[1]["before"]["cnn.0.weight"]
    assert ranks[0]["before"]["state_offset"] != ranks[1]["before"]["state_offset"]
    assert ranks[0]["setup"] == ranks[1]["setup"] == ranks[0]["before"]
    assert ranks[0]["after"] == ranks[1]["after"]
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["steps"] == STEPS and ranks[0]["world"] == 2

    _assert_matches_one_rank(ranks[0], *_one_rank_reference())

    # The checkpoint of step 2 resumes at world 2: the last two steps again, the same figures.
    resumed = _launch(tmp_path, "resume")
    assert resumed[0]["losses"] == resumed[1]["losses"] == ranks[0]["losses"][2:]
    assert resumed[0]["after"] == ranks[0]["after"]

    # ... and is refused at world 1, naming both world sizes.
    m1, o1 = policy_and_optimizer(seed=0)
    one = lf.Forge(device="cpu", ckpt_dir=str(tmp_path / "ck"))
    one.setup(m1, o1)
    with pytest.raises(lf.ForgeError, match="holds checkpoints of 2 rank.*this run has 1"):
        one.load()
    one.close()


@pytest.mark.skipif(not has_datafusion(), reason="this build has no DataFusion loader")
# Guards the same at world size 4 (two rows a rank): four ranks from four seeds end equal to each
# other and to one rank on the global batch.
def test_four_ranks_match_one_rank_on_the_global_batch(tmp_path):
    ranks = _launch(tmp_path, "fresh", nproc=4)
    assert len({json.dumps(r["before"]["cnn.0.weight"]) for r in ranks}) == 4
    assert all(r["setup"] == ranks[0]["before"] for r in ranks)
    assert all(r["after"] == ranks[0]["after"] and r["losses"] == ranks[0]["losses"]
               for r in ranks)
    assert ranks[0]["world"] == 4
    _assert_matches_one_rank(ranks[0], *_one_rank_reference())


def test_db_loader_is_sharded_by_rank(train_db, tmp_path):
    """forge.loader(path) passes the process group's rank and world size to DataFusionLoader:
    the two ranks read disjoint halves of the epoch."""
    ranks = _launch(tmp_path, "db", train_db)
    a, b = (set(r["seen"]) for r in ranks)
    assert ranks[0]["batches"] == ranks[1]["batches"] > 0
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == 2 * ranks[0]["batches"]
    assert a and b and not a & b
