"""The demo's figure (matplotlib, Agg): written from the trainer's records without a display."""
import json
import os

from loongforge import demo


# Guards the figure: both panels drawn from the summary's loss curve and the per-step JSONL
# records, saved as a PNG of the expected size, with blank JSONL lines and a missing file tolerated.
def test_plot_run_writes_png(tmp_path):
    curves, steps = {}, {}
    for mode, ms in (("baseline", 0.30), ("loongforge", 0.15)):
        curves[mode] = [{"step": i, "loss": 1.0 / i} for i in range(1, 21)]
        path = tmp_path / f"{mode}.jsonl"
        path.write_text("".join(json.dumps({"step": i, "step_s": ms * (10 if i == 1 else 1),
                                            "data_wait_s": ms / 10}) + "\n\n"
                                for i in range(1, 21)))
        steps[mode] = demo.read_jsonl(str(path))
        assert len(steps[mode]) == 20
    assert demo.read_jsonl(str(tmp_path / "missing.jsonl")) == []
    out = tmp_path / "loss.png"
    demo.plot_run(curves, steps, 2, str(out))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 450)
    assert os.path.getsize(out) > 20000  # two panels with lines and text, not an empty canvas
