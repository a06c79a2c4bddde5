"""The wheel holds every file of the packages, builds without a warning, installs and runs.

Slow (about a minute): it builds a wheel from the tracked files (``pip wheel --no-deps
--no-build-isolation``, offline: the dev extras bring setuptools), installs it in a new
virtual environment, and runs ``loop-actors --version`` and ``loop-actors eval
--builtin`` from there. The new environment has no dependencies of its own: a ``.pth``
line gives it this environment's site-packages, read after its own (whose ``.pth``
files, and so the editable install of this checkout, are not run), so what runs is the
installed wheel; the test checks that ``loop_actors`` is imported from it. Bad inputs
tried: a subpackage or data file left out of the packages' configuration (every tracked
file of the three trees must be in the wheel); setuptools' deprecation warnings (the
license table form) and its "absent from the packages configuration" warning.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aggregates", "loop_actors", "projections")
WARNINGS = ("SetuptoolsDeprecationWarning", "is absent from the `packages` configuration")


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from the tracked files: no git checkout here")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name]


def _run(*argv: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOP_ACTORS_", "PYTHON"))}
    env["PIP_NO_INDEX"] = "1"  # offline: nothing is downloaded
    return subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _tracked_files():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    built = _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
        "-w", dist, source, cwd=source,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    warned = [
        line
        for line in (built.stdout + built.stderr).splitlines()
        if any(w in line for w in WARNINGS)
    ]
    assert warned == []
    (found,) = dist.glob("loop_actors-*.whl")
    return found


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    wanted = {
        name
        for name in _tracked_files()
        if name.split("/")[0] in PACKAGES and (ROOT / name).is_file()
    }
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    assert sorted(wanted - shipped) == []
    assert "loop_actors/eval/builtin_cases/cases.json" in shipped
    metadata = next(name for name in shipped if name.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(metadata).decode()
    assert "License-Expression: MIT" in text
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in shipped)


def test_the_installed_wheel_runs_its_version_and_the_builtin_eval(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    made = _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    own_site = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
    )
    (Path(own_site.stdout.strip()) / "project-dependencies.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n"
    )
    where = _run(python, "-c", "import loop_actors; print(loop_actors.__file__)", cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr

    version = _run(venv / "bin" / "loop-actors", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, "loop-actors 0.2.0")
    evaluated = _run(
        venv / "bin" / "loop-actors", "eval", "--builtin", "--db", f"sqlite:///{tmp_path / 'eval.db'}",
        cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert "11/11 passed, 0 failed, 0 errored" in evaluated.stdout
