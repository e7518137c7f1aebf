import sys, os, traceback, torch
sys.path.insert(0, "bench/forge"); sys.path.insert(0, "python")
import hf_policy as H
torch._logging.set_logs(recompiles=True, graph_breaks=True)
from loongforge.blocks import CompiledBlocks
class A: pass
a = A(); a.image=224; a.text_hidden=512; a.text_layers=2; a.horizon=16; a.action_dim=32; a.vocab=32000; a.batch=4; a.text_len=16
dev = torch.device("cuda")
m = H.build(a, dev).to(dev); H.frozen_to_bf16(m)
blocks = CompiledBlocks(m); print(blocks.describe())
data = H.batches(2, a.batch, a.image, a.text_len, a.horizon, a.action_dim, a.vocab, dev)
ac = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
side = torch.cuda.Stream()
for i in range(3):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with ac(): loss = H.loss_fn(m, data[0])
        loss.backward()
    torch.cuda.current_stream().wait_stream(side)
    for p in m.parameters(): p.grad = None
torch.cuda.synchronize(); print("warm ok", dict(torch._dynamo.utils.counters["stats"]), flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "thread_local"
import contextlib
stance = torch.compiler.set_stance("eager_on_recompile") if "stance" in sys.argv else contextlib.nullcontext()
g = torch.cuda.CUDAGraph()
try:
    with stance, torch.cuda.graph(g, capture_error_mode=mode):
        with ac(): loss = H.loss_fn(m, data[0])
        print("fwd captured", flush=True)
        loss.backward()
    print("CAPTURE OK", flush=True); g.replay(); torch.cuda.synchronize(); print("replay ok", float(loss))
except Exception:
    traceback.print_exc()
print("after", dict(torch._dynamo.utils.counters["stats"]), flush=True)
