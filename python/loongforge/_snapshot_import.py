"""torch memory snapshot -> MemSculptor trace events, in plain Python (no torch, no loongforge._C).

Kept free of the compiled module on purpose: bench/memory/capture_traces.py loads this file by path
on the GPU machine, so a trace can be written even where ``loongforge._C`` failed to build.
``loongforge.memory.trace_from_snapshot`` builds its ``Trace`` from the same events.

Events (the text format of ``mem::Trace::ToText``, include/loongforge/memory.h)::

    ("s", time_ns, signature)          -> "s TIME_NS SIGNATURE"
    ("a", id, size, stream, time_ns)   -> "a ID SIZE STREAM TIME_NS"
    ("f", id, stream, time_ns)         -> "f ID STREAM TIME_NS"
"""
from __future__ import annotations

import bisect
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

Event = Tuple[Any, ...]


def snapshot_events(snapshot: Dict[str, Any], device: int = 0,
                    step_boundaries: Optional[Sequence[int]] = None,
                    signatures: Optional[Sequence[str]] = None) -> Iterator[Event]:
    """Events of ``snapshot["device_traces"][device]`` (see loongforge.memory.trace_from_snapshot
    for the rules). Times are nanoseconds relative to the first timed entry. Raises ValueError
    naming the entry for a malformed trace."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise ValueError("snapshot has no 'device_traces' list (record it with "
                         "torch.cuda.memory._record_memory_history() before _snapshot())")
    if device < 0 or device >= len(traces):
        raise ValueError(f"snapshot has device traces for {len(traces)} devices, not device {device}")
    entries = traces[device]
    bounds = sorted(set(step_boundaries or []))
    sigs: List[str] = list(signatures or [])
    step = 0
    yield ("s", 0, sigs[0] if sigs else "")
    live: Dict[int, int] = {}
    next_id = 1
    b = 0
    t0: Optional[float] = None
    for i, e in enumerate(entries):
        while b < len(bounds) and bounds[b] <= i:
            if bounds[b] > 0:  # step 0 is already open
                step += 1
                yield ("s", 0, sigs[step] if step < len(sigs) else "")
            b += 1
        try:
            action = e["action"]
            if action not in ("alloc", "free_requested", "free_completed"):
                continue
            addr = int(e["addr"])
            size = int(e["size"])
            stream = int(e.get("stream", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"device_traces[{device}][{i}]: malformed entry ({exc!r}): {e!r}") from None
        t_us = float(e.get("time_us", 0) or 0)
        if t0 is None and t_us:
            t0 = t_us
        t_ns = int((t_us - (t0 or 0.0)) * 1000) if t_us else 0
        if action == "alloc":
            if addr in live:
                raise ValueError(f"device_traces[{device}][{i}]: address {addr:#x} allocated "
                                 "again while live")
            live[addr] = next_id
            yield ("a", next_id, size, stream, t_ns)
            next_id += 1
        else:
            aid = live.pop(addr, None)
            if aid is None:
                if action == "free_requested":
                    # Allocated before recording began: a foreign free (id 0 is never allocated).
                    yield ("f", 0, stream, t_ns)
                continue
            yield ("f", aid, stream, t_ns)


def event_line(ev: Event) -> str:
    """One line of the text trace format (no newline)."""
    if ev[0] == "s":
        return f"s {ev[1]} {ev[2]}"
    if ev[0] == "a":
        return f"a {ev[1]} {ev[2]} {ev[3]} {ev[4]}"
    return f"f {ev[1]} {ev[2]} {ev[3]}"


def snapshot_to_text(snapshot: Dict[str, Any], device: int = 0,
                     step_boundaries: Optional[Sequence[int]] = None,
                     signatures: Optional[Sequence[str]] = None) -> str:
    """The trace in the text format read by ``loongforge mem plan|replay``."""
    return "".join(event_line(ev) + "\n"
                   for ev in snapshot_events(snapshot, device, step_boundaries, signatures))


def _site(frames: Any, depth: int) -> str:
    """Where an allocation was made: its innermost ``depth`` frames in loongforge's own files
    ("models/gr00t_dit.py:120 forward < ..."), else its innermost frame, else "(no stack)"."""
    if not isinstance(frames, list) or not frames:
        return "(no stack)"
    own = [f for f in frames if "loongforge/" in str(f.get("filename", ""))]
    picked = own[:depth] or frames[:1]
    out = []
    for f in picked:
        name = str(f.get("filename", "?"))
        if "loongforge/" in name:
            name = name.rsplit("loongforge/", 1)[1]
        out.append(f"{name}:{f.get('line', '?')} {f.get('name', '?')}")
    return " < ".join(out)


def peak_breakdown(snapshot: Dict[str, Any], device: int = 0, depth: int = 2,
                   top: int = 20) -> Dict[str, Any]:
    """What was live when the recorded allocations peaked.

    Replays ``snapshot["device_traces"][device]`` (alloc / free_requested; a free_completed
    without a request also ends a block), finds the entry at which the live bytes peaked, and
    groups the blocks live there by their allocation site (:func:`_site`: the innermost ``depth``
    frames in loongforge's files). Returns {"peak_bytes", "peak_entry", "entries", "sites":
    [{"site", "bytes", "blocks"}] largest first (at most ``top``, the rest summed as "(other)")}.
    Blocks allocated before recording began are not seen. Raises ValueError as snapshot_events."""
    entries = snapshot.get("device_traces", [[]])
    if not isinstance(entries, list) or not 0 <= device < len(entries):
        raise ValueError(f"snapshot has no device trace {device} (record it with "
                         "torch.cuda.memory._record_memory_history() before _snapshot())")
    entries = entries[device]

    def replay(stop: int) -> Tuple[Dict[int, Tuple[int, int]], int, int]:
        live: Dict[int, Tuple[int, int]] = {}  # addr -> (size, entry index)
        cur = best = 0
        best_i = -1
        for i, e in enumerate(entries[:stop]):
            action = e.get("action")
            if action == "alloc":
                size = int(e["size"])
                live[int(e["addr"])] = (size, i)
                cur += size
                if cur > best:
                    best, best_i = cur, i
            elif action in ("free_requested", "free_completed"):
                blk = live.pop(int(e["addr"]), None)
                if blk is not None:
                    cur -= blk[0]
        return live, best, best_i

    _, peak, peak_i = replay(len(entries))
    live, _, _ = replay(peak_i + 1)
    sites: Dict[str, List[int]] = {}
    for size, i in live.values():
        s = sites.setdefault(_site(entries[i].get("frames"), depth), [0, 0])
        s[0] += size
        s[1] += 1
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])
    rows = [{"site": k, "bytes": v[0], "blocks": v[1]} for k, v in ranked[:top]]
    rest = ranked[top:]
    if rest:
        rows.append({"site": "(other)", "bytes": sum(v[0] for _, v in rest),
                     "blocks": sum(v[1] for _, v in rest)})
    return {"peak_bytes": peak, "peak_entry": peak_i, "entries": len(entries), "sites": rows}


def _unmap(segs: Dict[int, Tuple[int, Any]], a: int, b: int) -> int:
    """Removes [a, b) from the disjoint ranges ``segs`` (start -> (size, stream)), splitting the
    ranges it cuts (an expandable segment unmaps part of what it mapped); returns the bytes
    removed."""
    removed = 0
    for s in [s for s, (n, _) in segs.items() if s < b and s + n > a]:
        n, stream = segs.pop(s)
        if s < a:
            segs[s] = (a - s, stream)
        if s + n > b:
            segs[b] = (s + n - b, stream)
        removed += min(s + n, b) - max(s, a)
    return removed


def reserved_breakdown(snapshot: Dict[str, Any], device: int = 0) -> Dict[str, Any]:
    """Where the reserved-but-free bytes were when the reserved memory peaked.

    Replays the device trace's segments (segment_alloc / segment_map add, segment_free /
    segment_unmap remove) and blocks (as :func:`peak_breakdown`), finds the entry at which the
    reserved bytes peaked, and for each segment live there sums the blocks allocated inside it.
    Segments are grouped by pool: the ``segment_pool_id`` of the dump's segment at the same
    address (torch names a graph's or MemPool's private pool that way; (0, 0) is the default
    pool), or "released before the dump" for a segment gone by then (for example torch's default
    pool emptied when a CUDA-graph capture began). The moment read is the one with the most
    bytes allocated while the reserved bytes stay at their peak. Returns {"reserved_peak_bytes",
    "entry" (that moment), "allocated_bytes" (live blocks then), "pools": [{"pool", "stream", "segments", "reserved",
    "allocated", "free"}] largest free first}. Blocks or segments made before recording began
    are not seen."""
    traces = snapshot.get("device_traces", [[]])
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        raise ValueError(f"snapshot has no device trace {device} (record it with "
                         "torch.cuda.memory._record_memory_history() before _snapshot())")
    entries = traces[device]
    adds, removes = ("segment_alloc", "segment_map"), ("segment_free", "segment_unmap")

    def replay(stop: int) -> Tuple[Dict[int, Tuple[int, Any]], Dict[int, int], int, int]:
        segs: Dict[int, Tuple[int, Any]] = {}  # addr -> (size, stream)
        blocks: Dict[int, int] = {}  # addr -> size
        cur = best = 0
        best_i = -1
        for i, e in enumerate(entries[:stop]):
            action = e.get("action")
            if action in adds:
                size = int(e["size"])
                segs[int(e["addr"])] = (size, e.get("stream", 0))
                cur += size
                if cur > best:
                    best, best_i = cur, i
            elif action in removes:  # a whole segment, or part of an expandable one
                cur -= _unmap(segs, int(e["addr"]), int(e["addr"]) + int(e["size"]))
            elif action == "alloc":
                blocks[int(e["addr"])] = int(e["size"])
            elif action in ("free_requested", "free_completed"):
                blocks.pop(int(e["addr"]), None)
        return segs, blocks, best, best_i

    _, _, peak, peak_i = replay(len(entries))
    # The reserved bytes stay at the peak until the next segment event; the moment of that span
    # with the most bytes allocated (the block that made the segment comes just after it) is the
    # one whose free bytes no allocation could have used.
    end = next((i for i in range(peak_i + 1, len(entries))
                if entries[i].get("action") in adds + removes), len(entries))
    at, cur, best_alloc = peak_i, 0, -1
    live: Dict[int, int] = {}
    for i, e in enumerate(entries[:end]):
        action = e.get("action")
        if action == "alloc":
            live[int(e["addr"])] = int(e["size"])
            cur += int(e["size"])
        elif action in ("free_requested", "free_completed"):
            cur -= live.pop(int(e["addr"]), 0)
        if i >= peak_i and cur > best_alloc:
            at, best_alloc = i, cur
    segs, blocks, _, _ = replay(at + 1)
    dumped = {int(s["address"]): s for s in snapshot.get("segments", []) if "address" in s}
    dstarts = sorted(dumped)

    def dump_of(addr: int) -> Any:  # the dumped segment holding addr (expandable: one for many)
        k = bisect.bisect_right(dstarts, addr) - 1
        if k < 0:
            return None
        d = dumped[dstarts[k]]
        return d if addr < dstarts[k] + int(d.get("total_size", 0)) else None

    starts = sorted(segs)
    pools: Dict[Tuple[str, Any], List[int]] = {}
    used = {a: 0 for a in starts}
    for addr, size in blocks.items():  # each block into the segment that holds it
        k = bisect.bisect_right(starts, addr) - 1
        if k >= 0 and addr < starts[k] + segs[starts[k]][0]:
            used[starts[k]] += size
    for addr in starts:
        size, stream = segs[addr]
        d = dump_of(addr)
        pool = (str(tuple(d["segment_pool_id"])) if d is not None and "segment_pool_id" in d
                else "in the dump (no pool id)" if d is not None else "released before the dump")
        row = pools.setdefault((pool, stream), [0, 0, 0])
        row[0] += 1
        row[1] += size
        row[2] += used[addr]
    rows = [{"pool": p, "stream": st, "segments": v[0], "reserved": v[1], "allocated": v[2],
             "free": v[1] - v[2]} for (p, st), v in pools.items()]
    rows.sort(key=lambda r: -r["free"])
    return {"reserved_peak_bytes": peak, "entry": at,
            "allocated_bytes": sum(used.values()), "pools": rows}
