"""The package as a user gets it: `python -m build` makes an sdist and a wheel; the wheel installs
into a fresh environment outside the source tree (its dependencies reused from this one, not
downloaded: a `.pth` file points at this environment's site-packages) and runs the main job from
there, its policy plug-in shipped inside the package (this is the suite's run of the main job,
`make demo`, end to end); `scopecast bench` says it needs a checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from scopecast.ray_cluster.demo import LANS

ROOT = Path(__file__).resolve().parents[1]
DEMO_SECONDS = 120  # the bound for `scopecast demo --rows 2000` from the wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh environment with the wheel installed; its bin directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("scopecast-*.whl")
    (sdist,) = dist.glob("scopecast-*.tar.gz")
    assert sdist.stat().st_size > 0
    env = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    (site,) = (env / "lib").glob("python*/site-packages")
    (site / "reuse-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
                    "install", "--no-deps", "-q", str(wheel)], check=True, capture_output=True,
                   timeout=300)
    return env / "bin"


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    return {**env, "SCOPECAST_HOME": str(tmp_path / "home")}


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


@pytest.mark.quiet_machine
def test_the_wheel_runs_the_demo_outside_the_source_tree(installed, tmp_path):
    where = subprocess.run([installed / "python", "-c", "import scopecast.ray_cluster.demo as d; "
                            "print(d.__file__); print(d.POLICY_FILE.exists())"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    module, policy = where.stdout.split()
    assert module.startswith(str(installed.parent)) and policy == "True", where.stdout
    try:
        out = subprocess.run([installed / "scopecast", "demo", "--rows", "2000",
                              "--plot", str(tmp_path / "demo.png")], cwd=tmp_path,
                             env=_env(tmp_path), capture_output=True, text=True,
                             timeout=DEMO_SECONDS)
    except subprocess.TimeoutExpired as late:  # what it had done by then says where it stood
        pytest.fail(f"the demo ran past {DEMO_SECONDS} s:\n{_text(late.stdout)[-3000:]}\n"
                    f"{_text(late.stderr)[-5000:]}")
    text = out.stdout
    assert out.returncode == 0, text[-3000:] + out.stderr[-3000:]
    assert "Spark read 2,000 flights" in text and "every subscriber got every row" in text
    # each LAN's NAKs are reported (without loss there should be next to none: `make bench`
    # counts them against its target), and no LAN's content differs
    assert all(re.search(rf"^{lan}: [\d,]+ NAKs", text, re.M) for lan in LANS), text
    assert "DIFFERS" not in text and (tmp_path / "demo.png").stat().st_size > 0
    # a normal run prints no warning, and none of Ray's core INFO lines (Spark's JVMs print
    # them: ray_private.route_console_notices, spark._driver_jvm_stderr)
    console = text + out.stderr
    assert not re.search(r"WARN| I \d+ \d+\] \S+\.cc:\d+:", console), console[-3000:]


def test_bench_from_the_wheel_says_it_needs_a_checkout(installed, tmp_path):
    out = subprocess.run([installed / "scopecast", "bench"], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "source tree" in out.stderr, out.stderr
