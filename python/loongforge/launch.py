"""``loongforge launch``: start N processes of one program on this host, as torchrun would.

    loongforge launch --nproc N [--master-port P] [--master-addr A] -- SCRIPT ARGS...
    loongforge launch --nproc N [...] -- -m MODULE ARGS...
    loongforge launch --nproc N [...] train ARGS...          (the trainer, python -m loongforge.train)

Each process gets the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so ``torch.distributed.init_process_group`` reads them through its
default ``env://`` rendezvous: gloo on a CPU, NCCL on GPUs. It exists because one spelling has to
work on Debian's torch 1.13, whose ``torchrun`` fails on Python 3.11 and whose
``torch.distributed.run`` spells the flag ``--nproc_per_node``, and on torch 2.x alike.

Each line a process writes is prefixed with ``[rank R]`` (stdout to stdout, stderr to stderr).
SIGINT and SIGTERM are passed on to every process. When one process fails, the others are ended
(SIGTERM, then SIGKILL after ``--grace`` seconds) and the launcher exits with that process's code
and a line naming its rank; a process ended by a signal counts as 128 + the signal's number. Bad
flags exit 2.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, List, Optional, Sequence

PROG = "loongforge launch"
# The package's parent folder, so children import this checkout's loongforge like the launcher.
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LaunchError(Exception):
    """A usage error: the message is printed as one line and the exit code is 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} --nproc N [options] (-- SCRIPT ARGS | -- -m MODULE ARGS | "
        "train ARGS)",
        description="Start N processes of a Python program on this host with the environment "
        "torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, "
        "MASTER_PORT). `train ARGS` runs the trainer (python -m loongforge.train ARGS).")
    p.add_argument("--nproc", type=int, required=True, help="number of processes (>= 1)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address rank 0 listens on for the rendezvous (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=0,
                   help="port of the rendezvous (default: a free port picked at start)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the other processes get after SIGTERM before SIGKILL, once one "
                   "fails or the launcher is interrupted (default 10)")
    p.add_argument("--no-prefix", action="store_true",
                   help="pass output through without the [rank R] prefix")
    return p


def _split(argv: Sequence[str]):
    """Splits the launcher's own flags from the command: at `--` or at the word `train`."""
    argv = list(argv)
    for i, a in enumerate(argv):
        if a == "--":
            return argv[:i], argv[i + 1:], False
        if a == "train":
            return argv[:i], argv[i + 1:], True
    return argv, None, False


def _command(rest: List[str], train: bool) -> List[str]:
    if train:
        return [sys.executable, "-m", "loongforge.train"] + rest
    if not rest:
        raise LaunchError("no program after `--` (give SCRIPT ARGS or -m MODULE ARGS)")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise LaunchError("-m needs a module name")
        return [sys.executable, "-m", rest[1]] + rest[2:]
    if rest[0].startswith("-"):
        raise LaunchError(f"'{rest[0]}' after `--`: expected a script path or -m MODULE")
    if not os.path.isfile(rest[0]):
        raise LaunchError(f"script '{rest[0]}' is not a file")
    return [sys.executable] + rest


def free_port(addr: str) -> int:
    """A port the OS reports free on addr now (rank 0 binds it a moment later, as torchrun does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def child_env(base: dict, rank: int, world: int, addr: str, port: int) -> dict:
    env = dict(base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", ROLE_RANK=str(rank),
               ROLE_WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT=str(port))
    # Lines from several processes interleave; unbuffered output keeps them in the order written.
    env.setdefault("PYTHONUNBUFFERED", "1")
    path = env.get("PYTHONPATH", "")
    if _PKG_PARENT not in path.split(os.pathsep):
        env["PYTHONPATH"] = _PKG_PARENT + (os.pathsep + path if path else "")
    return env


class _Pump(threading.Thread):
    """Copies one child's pipe to our stream line by line, each line prefixed; ends at EOF."""

    def __init__(self, src: IO[bytes], dst: IO[bytes], prefix: bytes, lock: threading.Lock):
        super().__init__(name=f"launch-pump-{prefix.decode().strip()}", daemon=True)
        self.src, self.dst, self.prefix, self.lock = src, dst, prefix, lock

    def run(self) -> None:
        for line in iter(self.src.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            with self.lock:
                try:
                    self.dst.write(self.prefix + line)
                    self.dst.flush()
                except (BrokenPipeError, ValueError):
                    pass
        self.src.close()


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _end_all(procs: List[subprocess.Popen], grace: float,
             sig: Optional[int] = signal.SIGTERM) -> None:
    """Sends sig (None: nothing, the ranks were signalled already) to the ranks still running,
    waits up to grace seconds for them all, then kills the rest."""
    for p in procs:
        if sig is not None and p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(nproc: int, cmd: List[str], addr: str = "127.0.0.1", port: int = 0, grace: float = 10.0,
        prefix: bool = True, env: Optional[dict] = None) -> int:
    """Runs cmd nproc times and returns the launcher's exit code (see the module docstring)."""
    port = port or free_port(addr)
    base = dict(os.environ if env is None else env)
    out = sys.stdout.buffer
    err = sys.stderr.buffer
    lock = threading.Lock()
    procs: List[subprocess.Popen] = []
    pumps: List[_Pump] = []
    received: List[int] = []

    def on_signal(signum, _frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(nproc):
            # A session of its own: a terminal's Ctrl-C reaches the children once, through the
            # launcher, and not a second time as members of the terminal's process group.
            p = subprocess.Popen(cmd, env=child_env(base, rank, nproc, addr, port),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            procs.append(p)
            tag = f"[rank {rank}] ".encode() if prefix else b""
            for src, dst in ((p.stdout, out), (p.stderr, err)):
                t = _Pump(src, dst, tag, lock)
                t.start()
                pumps.append(t)
        failed = None
        while failed is None:
            if received:
                # Interrupted: the ranks got the signal; their exit codes follow from it and are
                # no failure of their own. They get --grace seconds to finish.
                _end_all(procs, grace, sig=None)
                break
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c is not None and c != 0]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
        if failed is not None:
            rank, code = failed
            _end_all(procs, grace)
            for t in pumps:
                t.join(timeout=5)
            what = (f"was ended by signal {-code} ({signal.Signals(-code).name})" if code < 0
                    else f"exited with code {code}")
            with lock:
                sys.stderr.write(f"{PROG}: error: rank {rank} of {nproc} {what}; "
                                 f"ended the other ranks\n")
                sys.stderr.flush()
            return _exit_code(code)
        for t in pumps:
            t.join(timeout=5)
        if received:
            with lock:
                sys.stderr.write(f"{PROG}: {signal.Signals(received[0]).name} passed on to "
                                 f"{nproc} rank(s); exiting {128 + received[0]}\n")
                sys.stderr.flush()
            return 128 + received[0]
        return 0
    finally:
        if any(p.poll() is None for p in procs):
            _end_all(procs, grace)
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest, train = _split(argv)
    parser = _parser()
    args = parser.parse_args(own)  # exits 2 on a bad flag, 0 on --help
    try:
        if rest is None:
            raise LaunchError("no program: give `-- SCRIPT ARGS`, `-- -m MODULE ARGS` or "
                              "`train ARGS` after the launcher's flags")
        if args.nproc < 1:
            raise LaunchError(f"--nproc must be >= 1, got {args.nproc}")
        if not 0 <= args.master_port <= 65535:
            raise LaunchError(f"--master-port must be in 0..65535, got {args.master_port}")
        if args.grace < 0:
            raise LaunchError(f"--grace must be >= 0, got {args.grace}")
        cmd = _command(rest, train)
    except LaunchError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return run(args.nproc, cmd, args.master_addr, args.master_port, args.grace,
               not args.no_prefix)


if __name__ == "__main__":
    sys.exit(main())
