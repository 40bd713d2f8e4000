"""The two Dockerfiles: lint-clean, pinned, non-root, and their entrypoints are real commands.

No Docker engine runs here, so the images are never built in tests. Instead: hadolint checks the files,
the Dockerfiles are parsed for what must hold (pinned base, numeric non-root USER, the right extra), and
each image's ENTRYPOINT + CMD runs as a plain command from the project's virtualenv, with the packages
the image does not install made unimportable (torch for the operator, kopf and the kubernetes client for
the trainer). That proves the entrypoint exists and works with exactly the image's dependency set.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from chartkit import REPO_ROOT, exec_form, instructions, last_stage
from kubetrain_operator import api
from kubetrain_operator.planning import builders
from testcluster import processes

pytestmark = pytest.mark.unit

HADOLINT = Path(sys.executable).with_name("hadolint")
HADOLINT_CONFIG = REPO_ROOT / ".hadolint.yaml"
DOCKERFILES = {"operator": REPO_ROOT / "Dockerfile.operator", "trainer": REPO_ROOT / "Dockerfile.trainer"}
EXTRAS = {"operator": "operator", "trainer": "trainer"}
ABSENT_FROM_IMAGE = {
    # The operator image installs `.[operator]` only: no torch, torchvision or plotting stack.
    "operator": ("torch", "torchvision", "matplotlib"),
    # The trainer image installs `.[trainer]` only: no kopf, kubernetes client or prometheus client.
    "trainer": ("kopf", "kubernetes", "prometheus_client"),
}
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")


def run_hadolint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--config", str(HADOLINT_CONFIG), "--no-color", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_finds_nothing_in_either_dockerfile() -> None:
    result = run_hadolint(*DOCKERFILES.values())
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_config_fails_a_sloppy_dockerfile(tmp_path: Path) -> None:
    """The lint gate can fail: an unpinned base, unpinned pip and an untrusted registry are all reported."""
    sloppy = tmp_path / "Dockerfile"
    sloppy.write_text("FROM quay.io/someone/python:latest\nRUN pip install requests\nCMD python app.py\n")
    result = run_hadolint(sloppy)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3026", "DL3025"):
        assert rule in result.stdout, result.stdout


@pytest.mark.parametrize("image", DOCKERFILES)
def test_every_base_image_is_an_exact_slim_python_tag(image: str) -> None:
    bases = [rest.split()[0] for key, rest in instructions(DOCKERFILES[image]) if key == "FROM"]
    assert bases, "no FROM"
    for base in bases:
        assert PINNED_BASE.match(base), f"{base} is not an exact python:3.11.N-slim tag"


@pytest.mark.parametrize("image", DOCKERFILES)
def test_final_stage_runs_as_a_numeric_non_root_user(image: str) -> None:
    """A numeric uid lets the kubelet enforce runAsNonRoot without reading the image's /etc/passwd."""
    users = [rest for key, rest in last_stage(DOCKERFILES[image]) if key == "USER"]
    assert users, "the final stage never switches away from root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]


def test_trainer_image_uid_matches_the_worker_pods_default_security_context() -> None:
    """The operator runs workers as its default uid/gid: files the image and the volumes hold match."""
    pod = builders.RESTRICTED_POD_SECURITY
    users = [rest for key, rest in last_stage(DOCKERFILES["trainer"]) if key == "USER"]
    assert users[-1] == f"{pod['runAsUser']}:{pod['runAsGroup']}"


@pytest.mark.parametrize("image", DOCKERFILES)
def test_image_installs_the_project_wheel_with_only_its_own_extra(image: str) -> None:
    """The pinned dependencies of the image's own extra, in a layer of their own (torch is gigabytes: a
    code change must not rebuild it), then the one wheel `pip wheel .` built, whatever its version."""
    assert f"['optional-dependencies']['{EXTRAS[image]}']" in DOCKERFILES[image].read_text()
    installs = [
        rest for key, rest in last_stage(DOCKERFILES[image]) if key == "RUN" and "pip install" in rest
    ]
    assert len(installs) == 2, installs
    assert installs[0].startswith("pip install --requirement /requirements.txt"), installs[0]
    assert installs[1].startswith("pip install --no-deps /wheels/kubetrain-*-py3-none-any.whl"), installs[1]


def test_trainer_extra_pins_the_torch_pair_the_image_ships() -> None:
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch==2.14.1" in extra["trainer"] and "torchvision==0.29.2" in extra["trainer"]
    assert not [dep for dep in extra["operator"] if dep.startswith(("torch", "torchvision"))]


def test_build_context_keeps_only_what_the_wheel_needs() -> None:
    """.dockerignore starts from nothing and re-admits the sources the Dockerfiles COPY."""
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    admitted = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    for dockerfile in DOCKERFILES.values():
        for key, rest in instructions(dockerfile):
            if key == "COPY" and not rest.startswith("--from"):
                sources = rest.split()[:-1]
                assert set(sources) <= admitted, f"{dockerfile.name} copies {sources}, not all admitted"


def _blocker(directory: Path, modules: tuple[str, ...]) -> Path:
    """A directory that, first on PYTHONPATH, makes `modules` fail to import as if not installed."""
    for module in modules:
        package = directory / module
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            f"raise ModuleNotFoundError({module!r} + ' is not installed in this image', name={module!r})\n"
        )
    return directory


@pytest.mark.parametrize("image", DOCKERFILES)
def test_entrypoint_runs_as_a_plain_command_without_other_images_packages(image: str, tmp_path: Path) -> None:
    command = exec_form(DOCKERFILES[image], "ENTRYPOINT") + exec_form(DOCKERFILES[image], "CMD")
    assert command and command[0] == "kubetrain", command
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(_blocker(tmp_path / "blocked", ABSENT_FROM_IMAGE[image])),
    }
    result = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, timeout=120, env=env, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, f"`{' '.join(command)} --help` failed:\n{result.stdout}\n{result.stderr}"
    assert "usage:" in result.stdout.lower()
    assert command[-1] in result.stdout, result.stdout


def test_blocker_really_hides_a_module(tmp_path: Path) -> None:
    """Guards the entrypoint test: with the blocker first on the path, importing torch must fail."""
    env = {**os.environ, "PYTHONPATH": str(_blocker(tmp_path / "blocked", ("torch",)))}
    result = subprocess.run(
        [sys.executable, "-c", "import torch"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode != 0
    assert "is not installed in this image" in result.stderr


def test_wheel_the_dockerfiles_install_builds_from_the_admitted_context(tmp_path: Path) -> None:
    """Replays the build stage: only what the COPY lines bring in, `pip wheel --no-deps`, and the
    result is the wheel the final stage installs, with both packages and the `kubetrain` command.

    --no-build-isolation uses this virtualenv's setuptools so the test needs no network.
    """
    context = tmp_path / "src"
    context.mkdir()
    for key, rest in instructions(DOCKERFILES["operator"]):
        if key == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for source in sources:
                origin = REPO_ROOT / source
                if origin.is_dir():
                    shutil.copytree(
                        origin, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
                    )
                else:
                    shutil.copy2(origin, context / source)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
         str(wheels), str(context)],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path,
    )  # fmt: skip
    built = [path.name for path in wheels.glob("*.whl")]
    installs = [
        rest for key, rest in last_stage(DOCKERFILES["operator"]) if key == "RUN" and "pip install" in rest
    ]
    pattern = next(arg for arg in installs[-1].split() if arg.startswith("/wheels/"))
    assert len(built) == 1 and fnmatch.fnmatchcase(f"/wheels/{built[0]}", pattern), (built, installs)
    with zipfile.ZipFile(wheels / built[0]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {
        "kubetrain_operator/cli.py",
        "kubetrain_operator/runtime/main.py",
        "kubetrain_operator/planning/planner.py",
        "kubetrain_trainer/cli.py",
        "kubetrain_trainer/components/training_loop.py",
    } <= names
    assert "kubetrain = kubetrain_operator.cli:main" in entry_points


def test_trainer_image_runs_the_worker_command_the_operator_builds(tmp_path: Path) -> None:
    """Workers of the built-in trainer with several processes run `torchrun --no-python kubetrain train`:
    both commands must exist with only the trainer image's packages. torchrun reads the PET_* defaults the
    operator injects; one local process on a free port keeps it cheap."""
    spec = api.TrainingJobSpec.model_validate({"workers": 1, "nprocPerWorker": 2, "trainer": {}})
    command, args = builders.worker_command(spec)
    assert command[0] == "torchrun" and args is None, command
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(_blocker(tmp_path / "blocked", ABSENT_FROM_IMAGE["trainer"])),
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(processes.free_port()),
    }
    result = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, timeout=180, env=env, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "usage: kubetrain train" in result.stdout
