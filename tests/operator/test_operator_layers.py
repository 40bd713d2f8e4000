"""The operator's rooms, checked: its folders are its layers, and the code keeps their order.

A statement of layers in a docstring goes stale the day someone imports `kube` from the planner; this test
reads every module's imports (without importing it) and fails naming the module and the import that
breaks the order. The rule: a module imports only the modules listed before it in its own folder, and
the folders below its own (`api` under `planning`; `runtime` and `local` side by side over both; `remote`
over `runtime`; `cli` on top). A module never imports its own folder's face (`__init__.py`), so no import
can go round in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kubetrain_operator
import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(kubetrain_operator.__file__).parent

# Each folder's modules in order: a module may import only those listed before it.
FOLDERS: dict[str, tuple[str, ...]] = {
    "api": (
        "constants",
        "base",
        "quantities",
        "compute",
        "volumes",
        "environment",
        "scheduling",
        "policies",
        "jobspec",
        "jobstatus",
        "trainingjob",
        "names",
        "fieldpaths",
        "crdgen",
        "apidocs",
    ),
    "planning": (
        "observe",
        "status",
        "failure",
        "gang",
        "builders",
        "admission",
        "plans",
        "queueing",
        "steps",
        "whole_group",
        "elastic_group",
        "planner",
    ),
    "runtime": (
        "watchstream",
        "connections",
        "kube",
        "leader",
        "health",
        "heap",
        "cache",
        "informer",
        "events",
        "metrics",
        "workeridentity",
        "workqueue",
        "controller",
        "discovery",
        "main",
    ),
    "local": ("manifests", "processes", "group_run", "elastic_run", "command"),
    "remote": ("outputs", "copying"),
}
# The folders each folder stands on: runtime and local never import each other.
BELOW: dict[str, set[str]] = {
    "api": set(),
    "planning": {"api"},
    "runtime": {"api", "planning"},
    "local": {"api", "planning"},
    "remote": {"api", "planning", "runtime"},
}
TOP = ("cli",)
"""Modules at the package's top, over every folder."""
PURE = ("api", "planning")
# What no module of a pure folder may reach for: the network, processes, threads, kopf, torch.
IO_LIBRARIES = {"kopf", "kubernetes", "urllib3", "urllib", "socket", "subprocess", "threading", "torch"}
# The trainer's torch-free modules, the only ones the operator may import (it installs without torch).
TRAINER_TORCH_FREE = {"config", "contract", "exit_codes", "termination"}

MODULES = [(folder, name) for folder, names in FOLDERS.items() for name in names] + [("", n) for n in TOP]


def _where(folder: str, name: str) -> Path:
    return PACKAGE / folder / f"{name}.py" if folder else PACKAGE / f"{name}.py"


def _operator_module(dotted: str, name: str) -> tuple[str, str] | None:
    """The (folder, module) that `from <dotted> import <name>` takes from the operator; the module "" is a
    folder's face (its __init__.py)."""
    parts = dotted.split(".")[1:]
    if not parts:  # from kubetrain_operator import <folder> | cli | __version__
        if name in FOLDERS:
            return (name, "")
        return ("", name) if name in TOP else None
    folder = parts[0]
    if len(parts) > 1:
        return (folder, parts[1])
    return (folder, name) if (PACKAGE / folder / f"{name}.py").exists() else (folder, "")


def imports_of(
    folder: str, name: str, *, at_import_time: bool = False
) -> tuple[set[tuple[str, str]], set[str]]:
    """((folder, module) of the operator, outside packages and `kubetrain_trainer.<module>` names).

    `at_import_time` keeps only what importing the module runs, leaving out the imports inside functions
    (the CLI imports the trainer, and with it torch, only when asked to train).
    """
    tree = ast.parse(_where(folder, name).read_text())
    nodes = tree.body if at_import_time else ast.walk(tree)
    operator: set[tuple[str, str]] = set()
    outside: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            top, _, rest = node.module.partition(".")
            if top == "kubetrain_operator":
                operator |= {
                    m for a in node.names if (m := _operator_module(node.module, a.name)) is not None
                }
            elif top == "kubetrain_trainer":
                outside |= (
                    {f"kubetrain_trainer.{rest}"}
                    if rest
                    else {f"kubetrain_trainer.{a.name}" for a in node.names}
                )
            else:
                outside.add(top)
        elif isinstance(node, ast.Import):
            outside |= {alias.name.partition(".")[0] for alias in node.names}
    return operator, outside


def test_every_module_has_a_place_in_its_folders_stated_order() -> None:
    found = {
        (path.parent.name if path.parent != PACKAGE else "", path.stem)
        for path in PACKAGE.rglob("*.py")
        if path.stem != "__init__"
    }
    assert found == set(MODULES), (
        f"unplaced: {sorted(found - set(MODULES))}, gone: {sorted(set(MODULES) - found)}"
    )


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folders_docstring_names_its_modules_and_the_package_names_its_folders(folder: str) -> None:
    face = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
    assert all(f"`{name}`" in face for name in FOLDERS[folder]), f"{folder}/__init__.py names every module"
    assert f"`{folder}/`" in (kubetrain_operator.__doc__ or ""), "the package docstring names every folder"


@pytest.mark.parametrize(("folder", "name"), MODULES, ids=[f"{f}/{n}" if f else n for f, n in MODULES])
def test_each_module_imports_only_earlier_modules_of_its_folder_and_the_folders_below(
    folder: str, name: str
) -> None:
    imported, _ = imports_of(folder, name)
    if not folder:  # the top stands on every folder
        wrong = {m for f, m in imported if not f and m not in TOP[: TOP.index(name)]}
        assert not wrong, f"{name} imports {sorted(wrong)}, listed after it"
        return
    earlier = set(FOLDERS[folder][: FOLDERS[folder].index(name)])
    wrong = {
        f"{f}/{m or '__init__'}"
        for f, m in imported
        if not (f == folder and m in earlier) and f not in BELOW[folder]
    }
    assert not wrong, f"{folder}/{name} imports {sorted(wrong)}: not listed before it, nor in a folder below"


@pytest.mark.parametrize(
    ("folder", "name"),
    [(f, n) for f, n in MODULES if f in PURE],
    ids=[f"{f}/{n}" for f, n in MODULES if f in PURE],
)
def test_the_pure_folders_do_no_io(folder: str, name: str) -> None:
    _, outside = imports_of(folder, name)
    assert not outside & IO_LIBRARIES, f"{folder}/{name} imports {sorted(outside & IO_LIBRARIES)}"


@pytest.mark.parametrize(("folder", "name"), MODULES, ids=[f"{f}/{n}" if f else n for f, n in MODULES])
def test_importing_the_operator_imports_only_the_trainers_torch_free_modules(folder: str, name: str) -> None:
    _, outside = imports_of(folder, name, at_import_time=True)
    trainer = {module.partition(".")[2] for module in outside if module.startswith("kubetrain_trainer.")}
    assert trainer <= TRAINER_TORCH_FREE, (
        f"{folder}/{name} imports kubetrain_trainer.{sorted(trainer - TRAINER_TORCH_FREE)}"
    )
    assert not outside & {"torch", "torchvision"}, f"{folder}/{name}"
