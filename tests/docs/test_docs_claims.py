"""Claims of the README and docs/ that can drift from the code, each checked against what it describes.

Each test reads the sentence, table or sample the user reads and compares it with the source of truth:
the CRD's printer columns, the operator's argument parser and options, the worker command the builders
make, the files a link or a path names. (The chart README's values and RBAC tables are checked in
tests/chart/test_chart_readme.py; the metric names of docs/operations.md against a running operator in
tests/operator_cluster/test_operator_metrics_served.py; the README's install and quickstart commands in
tests/release and tests/chart/test_chart_cluster.py.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetrain_operator import api, cli
from kubetrain_operator.planning import builders
from kubetrain_operator.runtime import main
from testcluster import binaries

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
CRD = REPO_ROOT / "crds" / "kubetrain.io_trainingjobs.yaml"
TRAININGJOB_DOC = REPO_ROOT / "docs" / "trainingjob.md"
TRAINER_README = REPO_ROOT / "trainer" / "kubetrain_trainer" / "README.md"
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"


def user_documents() -> list[Path]:
    """The pages a user reads: the READMEs and docs/."""
    return [
        README,
        REPO_ROOT / "charts" / "kubetrain" / "README.md",
        REPO_ROOT / "trainer" / "kubetrain_trainer" / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
    ]


def _rel(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


# --- `kubectl get trainingjobs` ---------------------------------------------------------------------------


def readme_kubectl_get_sample() -> list[str]:
    """The lines of the README's sample of `kubectl get trainingjobs`: the first code block after it says
    what `kubectl get trainingjobs` shows."""
    text = README.read_text()
    after = text[text.index("What `kubectl get trainingjobs` shows") :]
    block = after.split("```\n", 2)[1]
    return block.rstrip("\n").splitlines()


def test_the_readme_kubectl_get_sample_has_the_columns_the_crd_prints() -> None:
    """kubectl prints NAME and then the CRD's additionalPrinterColumns of priority 0 (the others only with
    -o wide), upper-cased, in order; the sample's header must be exactly that, and every row must fill the
    columns the header lays out (no value straddling two)."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    printed = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    header, *rows = readme_kubectl_get_sample()
    assert header.split() == ["NAME", *printed]
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    assert rows, "the sample shows no TrainingJob"
    for row in rows:
        for match in re.finditer(r"\S+", row):
            assert match.start() in starts, f"{row!r}: {match.group()!r} is not under a column of the header"


def test_the_readme_names_the_wide_columns_kubectl_adds() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    text = README.read_text()
    sentence = text[text.index("`-o wide` adds") :].split(")", 1)[0]
    named = {"Epochs": "epochs", "Val-Accuracy": "validation accuracy", "Message": "the last message"}
    assert set(wide) == set(named), f"the CRD's wide columns changed: {wide}; say so in the README"
    for column in wide:
        assert named[column] in sentence, f"the README's `-o wide` sentence does not name {column}"


# --- links and paths --------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def relative_links(path: Path) -> list[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("path", user_documents(), ids=_rel)
def test_every_relative_link_resolves(path: Path) -> None:
    """A link to a file names one that exists; a link with #anchor names a heading of that page."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(
                f"{target}: no {resolved.relative_to(REPO_ROOT) if resolved.is_relative_to(REPO_ROOT) else resolved}"
            )
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {_rel(resolved)}")
    assert not broken, f"{_rel(path)}: " + "; ".join(broken)


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# There\n\n## Some `code` here: yes\n")
    page.write_text(
        "[a](there.md#some-code-here-yes) [b](missing.md) [c](there.md#nowhere) [d](https://x.y/z)\n"
    )
    assert relative_links(page) == ["there.md#some-code-here-yes", "missing.md", "there.md#nowhere"]
    assert anchors(tmp_path / "there.md") == {"there", "some-code-here-yes"}


REPO_PATH = re.compile(
    r"`((?:examples|docs|charts|crds|benchmarks|tests|hack|operator|trainer)/[A-Za-z0-9_.\-/]+)`"
)
"""A path of this repository written as code: `examples/cifar10-cpu.yaml`, `tests/chaos`."""


@pytest.mark.parametrize("path", user_documents(), ids=_rel)
def test_every_repository_path_the_docs_name_exists(path: Path) -> None:
    """A file or folder of this repository named in a page (outside code blocks: those show commands
    whose paths may be the user's) exists, relative to the repository root."""
    text = CODE_BLOCK.sub("", path.read_text())
    missing = sorted({name for name in REPO_PATH.findall(text) if not (REPO_ROOT / name).exists()})
    assert not missing, f"{_rel(path)} names paths that do not exist: {missing}"


# --- torchrun ---------------------------------------------------------------------------------------------

TORCHRUN_CLAIMS = {
    TRAININGJOB_DOC: (
        "A `command` job runs under `torchrun --no-python <command>` by default (`spec.launcher: torchrun`, "
        "whatever `nprocPerWorker` is",
        "`spec.launcher: plain` runs the command once per worker",
        "built-in trainer uses torchrun only when `nprocPerWorker > 1` or the job is elastic.",
    ),
    README: (
        "(a `command` job runs under torchrun by default, whatever `nprocPerWorker` is; the built-in trainer "
        "uses torchrun only when `nprocPerWorker > 1` or the job is elastic)",
    ),
}
"""What each page says about when torchrun starts the workers' program (compared with whitespace folded)."""


def _under_torchrun(spec: dict[str, Any]) -> bool:
    command, _ = builders.worker_command(api.TrainingJobSpec.model_validate({"workers": 2, **spec}))
    return command[:2] == ["torchrun", "--no-python"]


@pytest.mark.parametrize("path", TORCHRUN_CLAIMS, ids=_rel)
def test_the_torchrun_statement_is_written(path: Path) -> None:
    text = re.sub(r"\s+", " ", path.read_text())
    for claim in TORCHRUN_CLAIMS[path]:
        assert claim in text, f"{_rel(path)} no longer says: {claim!r}"


@pytest.mark.parametrize(
    ("spec", "torchrun"),
    [
        ({"command": ["python", "train.py"]}, True),
        ({"command": ["python", "train.py"], "nprocPerWorker": 1}, True),
        ({"command": ["python", "train.py"], "nprocPerWorker": 4}, True),
        ({"command": ["python", "train.py"], "launcher": "plain"}, False),
        ({"command": ["python", "train.py"], "launcher": "plain", "nprocPerWorker": 1}, False),
        ({"trainer": {"epochs": 1}}, False),
        ({"trainer": {"epochs": 1}, "nprocPerWorker": 1}, False),
        ({"trainer": {"epochs": 1}, "nprocPerWorker": 2}, True),
        ({"trainer": {"epochs": 1}, "elastic": {"minWorkers": 1, "maxWorkers": 3}}, True),
    ],
)
def test_the_torchrun_statement_holds_for_the_worker_command(spec: dict[str, Any], torchrun: bool) -> None:
    """What TORCHRUN_CLAIMS say, against the command the operator's builders give the worker container."""
    assert _under_torchrun(spec) is torchrun


# --- `kubetrain operator --help` and the documented defaults ------------------------------------------------


def operator_help() -> str:
    parser = cli._parser()
    operator = parser._subparsers._group_actions[0].choices["operator"]  # type: ignore[union-attr]
    return re.sub(r"\s+", " ", operator.format_help())


def operator_defaults() -> Any:
    return cli._parser().parse_args(["operator"])


def test_operator_help_states_the_defaults_the_parser_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every default `kubetrain operator --help` writes out is the one a bare `kubetrain operator` runs
    with (in an environment that sets none of the KUBETRAIN_* variables)."""
    for variable in [v for v in os.environ if v.startswith("KUBETRAIN_")]:
        monkeypatch.delenv(variable)
    text, args = operator_help(), operator_defaults()
    assert f"reconcile threads (default {args.workers})" in text
    assert f"{args.log_format} (default:" in text
    assert re.search(r"\{plain,full,json\}", text) and args.log_format in ("plain", "full", "json")
    assert f"default: {args.default_image}," in text
    assert f"e.g. {args.liveness}" in text, "the liveness example is the default URL"
    assert args.kueue is True and "--no-kueue" in text


def test_operations_doc_states_the_operator_defaults() -> None:
    """docs/operations.md's defaults against the operator's own (`Options`)."""
    options = main.Options()
    text = re.sub(r"\s+", " ", OPERATIONS_DOC.read_text())
    assert f"(`--metrics-port`, default {options.metrics_port})" in text
    assert "(`--leader-elect`)" in text and options.leader_elect is False


def test_the_worker_rendezvous_timeout_the_readme_quotes_is_the_trainers() -> None:
    from kubetrain_trainer.config import TrainerConfig

    default = TrainerConfig.model_fields["rendezvous_timeout_seconds"].default
    assert f"`trainer.rendezvous_timeout_seconds` (default {default})" in re.sub(
        r"\s+", " ", README.read_text()
    )


# --- the trainer README ---------------------------------------------------------------------------------

PROJECT_HISTORY = re.compile(
    r"\bissues? \d+|#\d+\b|\bwork items?\b|\bgit show\b|\bcommit [0-9a-f]{7,40}\b|\b[0-9a-f]{7,40}:|\bsession \d+"
)
"""How a page cites the project's history instead of saying what is true: `issue 13`, `#25`, a work item,
`git show 74f3557:...`, a commit hash, `session 6`."""


def test_the_trainer_readme_cites_no_issue_work_item_or_commit() -> None:
    """The trainer README describes the program; where a figure came from is a file under
    benchmarks/results, not an issue, a work item or a commit."""
    cited = [match.group(0) for match in PROJECT_HISTORY.finditer(TRAINER_README.read_text())]
    assert not cited, f"trainer/kubetrain_trainer/README.md cites the project's history: {cited}"


@pytest.mark.parametrize(
    "line",
    [
        "against issue 13's targets",
        "see #25",
        "(`git show 74f3557:x.md`)",
        "the work item",
        "run 3 (session 6)",
    ],
)
def test_the_history_pattern_finds_each_kind_of_citation(line: str) -> None:
    assert PROJECT_HISTORY.search(line)


# --- measured figures -----------------------------------------------------------------------------------

PERFORMANCE_DOC = REPO_ROOT / "docs" / "performance.md"
TIMING = re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms|minutes|MB/h)\b")
LOAD_SAID = ("**idle**", "**loaded**", "**not idle", "not an idle", "load not recorded")


def performance_sections() -> dict[str, str]:
    text = PERFORMANCE_DOC.read_text()
    return {
        part.split("\n", 1)[0]: part.split("\n", 1)[1]
        for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    }


def test_every_timed_section_of_performance_doc_says_its_machine_and_its_load() -> None:
    """A section of docs/performance.md that gives a time names the machine and says whether it was idle
    (in bold) or not: figures taken on a loaded machine must say so plainly."""
    sections = performance_sections()
    assert len(sections) >= 5, sorted(sections)
    for heading, body in sections.items():
        if not TIMING.search(body):
            continue
        assert re.search(r"machine|[0-9]+ (?:cores|CPUs)", body, flags=re.IGNORECASE), (
            f"{heading}: no machine"
        )
        assert any(said in body for said in LOAD_SAID), f"{heading}: says neither idle nor loaded"


def test_the_readme_gives_no_timing_of_its_own() -> None:
    """The README links measured figures instead of quoting them: no "N s" outside its code blocks, apart
    from settings (a timeout, a default)."""
    text = CODE_BLOCK.sub("", README.read_text())
    timings = [
        line.strip()
        for line in text.splitlines()
        if TIMING.search(line) and not re.search(r"timeout|default|within|every|after|seconds", line)
    ]
    assert not timings, f"the README quotes measured times; move them to docs/performance.md: {timings}"


def test_the_readme_versions_table_names_the_versions_the_chart_declares_and_the_suite_runs() -> None:
    """The table's oldest tested version, its newest, and the kubeVersion line come from the suite's own
    constants and Chart.yaml, so a version bump that forgets the README fails here."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Supported Kubernetes versions\n", 1)[1].split("\n## ", 1)[0]
    declared = yaml.safe_load((REPO_ROOT / "charts" / "kubetrain" / "Chart.yaml").read_text())["kubeVersion"]
    assert f'`kubeVersion: "{declared}"`' in section, section
    assert f"the oldest, {binaries.OLDEST_KUBERNETES_VERSION}, is tested" in section, section
    assert f"the whole suite runs on it ({binaries.KUBERNETES_VERSION})" in section, section
    oldest_minor = ".".join(binaries.OLDEST_KUBERNETES_VERSION.lstrip("v").split(".")[:2])
    assert declared == f">={oldest_minor}.0-0", declared
