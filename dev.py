#!/usr/bin/env python3
"""The project's two commands, on a fresh machine with nothing but Python installed.

    python3 dev.py demo     # set up .venv if needed, then run the main job
    python3 dev.py test     # set up .venv if needed, then run the test suite (lane by lane: tests/conftest.py;
                            # the slow lane in a second process beside the others)
    python3 dev.py test -m unit   # the fast lane alone (any arguments go to pytest as they are)
    python3 dev.py bench    # the solver benchmark (see benchmarks/)

Set-up is idempotent: ``.venv`` is created once (with access to system site-packages, so a
machine that already has torch >= 2.11, e.g. a CUDA machine, keeps its own build), torch is
installed as the CPU wheel when missing (never a multi-GB CUDA build on a CPU machine), then this
package is installed in editable mode with its test extras. A stamp file skips the install when
``pyproject.toml`` has not changed.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
STAMP = VENV / ".memplan-installed"
TORCH_CPU = "torch==2.13.0+cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _run(cmd: list[str], **kw: object) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, **kw)  # type: ignore[arg-type]


def _have_torch() -> bool:
    code = (
        "import torch, sys; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]);"
        "sys.exit(0 if v >= (2, 11) else 1)"
    )
    return subprocess.call([str(PY), "-c", code], stderr=subprocess.DEVNULL) == 0


def _install_torch() -> None:
    pip = [str(PY), "-m", "pip", "install", "-q"]
    # The CPU build, by its local version label: a wheel on this machine's disk (pip's find-links)
    # or one a configured index has; then PyTorch's CPU index; last, whatever pip finds (on macOS
    # and Windows the plain wheels are CPU builds).
    for args in ([TORCH_CPU], ["--extra-index-url", CPU_INDEX, TORCH_CPU], ["torch>=2.11"]):
        if _run(pip + args) == 0:
            return
    raise SystemExit("could not install torch; install torch>=2.11 yourself and rerun")


def ensure_env() -> None:
    """Create ``.venv`` and install the project into it, unless already done for this pyproject."""
    if not PY.exists():
        venv.EnvBuilder(with_pip=True, system_site_packages=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest and _have_torch():
        return
    if not _have_torch():
        _install_torch()
    if _run([str(PY), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"]) != 0:
        raise SystemExit("pip install -e .[test] failed")
    STAMP.write_text(digest)


def _test(rest: list[str], env: dict[str, str]) -> int:
    """The suite. With pytest arguments, one pytest run with them. Without: the ``slow`` lane (several
    processes, third-party models: about half the suite's time) in a second pytest process beside
    the other lanes, on this machine's two cores; its output follows theirs. Exit status: the
    first failing run's, else 0. Each of the two runs ends with its ten slowest tests (``--durations``),
    so that the suite's time has names next to it."""
    pytest = [str(PY), "-m", "pytest", "-q"]
    if rest:
        return _run([*pytest, *rest], cwd=ROOT, env=env)
    pytest.append("--durations=10")
    with tempfile.TemporaryFile(mode="w+") as out:
        print("+", " ".join([*pytest, "-m", "slow"]), "(beside the other lanes; its output follows theirs)",
              flush=True)
        slow = subprocess.Popen([*pytest, "-m", "slow"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rest_code = _run([*pytest, "-m", "not slow"], cwd=ROOT, env=env)
            slow_code = slow.wait()
        finally:
            if slow.poll() is None:
                slow.kill()
        out.seek(0)
        print(out.read(), end="", flush=True)
    return rest_code or slow_code


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "bench"}:
        print(__doc__)
        return 2
    ensure_env()
    cmd, rest = argv[0], argv[1:]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if cmd == "test":
        return _test(rest, env)
    return _run([str(PY), "-m", "lightning_memplan.cli", cmd, *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
