"""The operator's layers, checked: the order `kubetrain_operator/__init__.py` states is the order the code keeps.

A statement of layers in a docstring goes stale the day someone imports `kube` from the planner; this test
reads every module's imports (without importing it) and fails naming the module and the import that
breaks the order, so the pure core stays testable without a cluster and the picture stays true.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kubetrain_operator
import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(kubetrain_operator.__file__).parent

# The docstring's order: each module may import only modules listed before it.
API = ("constants", "api", "names")
PURE_CORE = (
    "fieldpaths",
    "observe",
    "status",
    "failure",
    "gang",
    "builders",
    "admission",
    "queueing",
    "reconcile",
    "membership",
    "crdgen",
    "apidocs",
)
IO_SHELL = (
    "kube",
    "leader",
    "cache",
    "informer",
    "events",
    "metrics",
    "manifests",
    "localrun",
    "localelastic",
    "workeridentity",
    "workqueue",
    "controller",
    "handlers",
    "main",
    "cli",
)
ORDER = API + PURE_CORE + IO_SHELL
# Pairs that import each other on purpose: a policy that builds on its planner's types.
MUTUAL = {frozenset({"reconcile", "membership"}), frozenset({"localrun", "localelastic"})}
# What no module of the API or the pure core may reach for: the network, processes, threads, kopf, torch.
IO_LIBRARIES = {"kopf", "kubernetes", "urllib3", "urllib", "socket", "subprocess", "threading", "torch"}
# The trainer's torch-free modules, the only ones the operator may import (it installs without torch).
TRAINER_TORCH_FREE = {"config", "contract", "exit_codes", "termination"}


def imports_of(module: str, *, at_import_time: bool = False) -> tuple[set[str], set[str]]:
    """(sibling modules of kubetrain_operator, outside packages and `kubetrain_trainer.<module>` names).

    `at_import_time` keeps only what importing the module runs, leaving out the imports inside functions
    (the CLI imports the trainer, and with it torch, only when asked to train).
    """
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    nodes = tree.body if at_import_time else ast.walk(tree)
    siblings: set[str] = set()
    outside: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            top, _, rest = node.module.partition(".")
            if top == "kubetrain_operator":
                siblings |= {rest.partition(".")[0]} if rest else {alias.name for alias in node.names}
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
    siblings.discard("__version__")
    return siblings, outside


def test_every_module_of_the_package_has_a_place_in_the_stated_order() -> None:
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ORDER), (
        f"unplaced: {sorted(modules - set(ORDER))}, gone: {sorted(set(ORDER) - modules)}"
    )
    docstring = kubetrain_operator.__doc__ or ""
    assert all(f"`{name}`" in docstring for name in ORDER), "the package docstring names every module"


@pytest.mark.parametrize("module", ORDER)
def test_each_module_imports_only_modules_listed_before_it(module: str) -> None:
    siblings, _ = imports_of(module)
    earlier = set(ORDER[: ORDER.index(module)])
    later = {name for name in siblings - earlier if frozenset({module, name}) not in MUTUAL}
    assert not later, f"{module} imports {sorted(later)}, listed after it"


@pytest.mark.parametrize("module", API + PURE_CORE)
def test_the_api_and_the_pure_core_do_no_io(module: str) -> None:
    _, outside = imports_of(module)
    assert not outside & IO_LIBRARIES, f"{module} imports {sorted(outside & IO_LIBRARIES)}"


@pytest.mark.parametrize("module", ORDER)
def test_importing_the_operator_imports_only_the_trainers_torch_free_modules(module: str) -> None:
    _, outside = imports_of(module, at_import_time=True)
    trainer = {name.partition(".")[2] for name in outside if name.startswith("kubetrain_trainer.")}
    assert trainer <= TRAINER_TORCH_FREE, (
        f"{module} imports kubetrain_trainer.{sorted(trainer - TRAINER_TORCH_FREE)}"
    )
    assert not outside & {"torch", "torchvision"}, module
