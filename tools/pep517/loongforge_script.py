#!python
"""The `loongforge` command of an installed wheel: bin/loongforge's dispatch, for the package as
installed (tools/pep517/loongforge_build.py puts this file in the wheel's scripts).

    loongforge train ARGS       the trainer (python -m loongforge.train)
    loongforge launch ARGS      N processes with torchrun's environment (loongforge/launch.py)
    loongforge demo ARGS        the demo (python -m loongforge.demo), using the installed CLI
    loongforge python ARGS      this Python
    loongforge COMMAND ARGS     the C++ CLI: pack, inspect, demo-data, bench, ckpt, mem, info

The package is found without being imported (find_spec), so the C++ commands start without
loading torch.
"""
import importlib.util
import os
import subprocess
import sys


def main() -> None:
    spec = importlib.util.find_spec("loongforge")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("loongforge: error: the loongforge package is not importable by " + sys.executable)
    pkg = list(spec.submodule_search_locations)[0]
    cli = os.path.join(pkg, "_bin", "loongforge")
    args = sys.argv[1:]
    cmd = args[0] if args else ""
    py = sys.executable
    if cmd == "train":
        argv = [py, "-m", "loongforge.train"] + args[1:]
    elif cmd == "launch":
        # By path: the launcher is standard library only, so it imports neither torch nor the
        # package.
        argv = [py, os.path.join(pkg, "launch.py")] + args[1:]
    elif cmd == "demo":
        argv = [py, "-m", "loongforge.demo", "--cli", cli] + args[1:]
    elif cmd == "python":
        argv = [py] + args[1:]
    else:
        if not os.access(cli, os.X_OK):
            sys.exit(f"loongforge: error: {cli} is missing (reinstall the loongforge wheel)")
        argv = [cli] + args
        if cmd in ("", "-h", "--help"):
            rc = subprocess.run(argv).returncode
            line = ("Python entry points (this script only): train (the trainer), launch "
                    "(several processes), demo, python.")
            print(line, file=sys.stdout if rc == 0 else sys.stderr)
            sys.exit(rc)
    sys.stdout.flush()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
