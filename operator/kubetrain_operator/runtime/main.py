"""Operator runtime: options, the start (one @kopf.on.startup), and `run`.

Each option is written in two places: a field of `Options` (its type, its default and the environment
variable the Deployment sets, read generically by `from_env`) and a flag of `kubetrain operator` (its help,
in `cli`), whose default is the environment's value; a test holds the two together. `kubetrain operator
--help` is the reference.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kopf

from kubetrain_operator import __version__, api
from kubetrain_operator.api import constants
from kubetrain_operator.planning import admission, gang, plans
from kubetrain_operator.runtime import (
    discovery,
    events,
    health,
    heap,
    informer,
    kube,
    leader,
    metrics,
    workeridentity,
)
from kubetrain_operator.runtime.cache import ClusterCache
from kubetrain_operator.runtime.controller import Controller

logger = logging.getLogger("kubetrain.operator")


TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("", "0", "false", "no")


def _env(variable: str) -> dict[str, str]:
    """The metadata of a field that the environment variable `variable` sets when no flag does."""
    return {"env": variable}


@dataclasses.dataclass
class Options:
    namespaces: list[str] = dataclasses.field(default_factory=list, metadata=_env("KUBETRAIN_NAMESPACES"))
    """Namespaces (or kopf glob patterns) to watch; none: $POD_NAMESPACE, else `default`."""
    all_namespaces: bool = dataclasses.field(default=False, metadata=_env("KUBETRAIN_ALL_NAMESPACES"))
    default_image: str = dataclasses.field(
        default=constants.TRAINER_IMAGE, metadata=_env("KUBETRAIN_DEFAULT_IMAGE")
    )
    worker_service_account: str | None = dataclasses.field(
        default=None, metadata=_env("KUBETRAIN_WORKER_SERVICE_ACCOUNT")
    )
    worker_cluster_role: str | None = dataclasses.field(
        default=None, metadata=_env("KUBETRAIN_WORKER_CLUSTER_ROLE")
    )
    """With it, the operator creates `worker_service_account`, bound to this ClusterRole, in each namespace
    where it creates workers (`workeridentity`)."""
    metrics_port: int = dataclasses.field(default=8080, metadata=_env("KUBETRAIN_METRICS_PORT"))
    """Where every replica serves /metrics from its start, a standby too (`metrics.Endpoint`); 0: nowhere."""
    liveness: str | None = dataclasses.field(
        default="http://0.0.0.0:8081/healthz", metadata=_env("KUBETRAIN_LIVENESS")
    )
    workers: int = dataclasses.field(default=16, metadata=_env("KUBETRAIN_WORKERS"))
    """The controller's reconcile threads (the informers only feed the cache and the queue)."""
    resync_seconds: float = plans.RESYNC_SECONDS
    verbose: bool = False
    log_format: str = dataclasses.field(default="full", metadata=_env("KUBETRAIN_LOG_FORMAT"))
    leader_elect: bool = dataclasses.field(default=False, metadata=_env("KUBETRAIN_LEADER_ELECT"))
    """HA through a coordination.k8s.io Lease: standbys run nothing until they hold it but answer the
    liveness endpoint (`health`) and serve /metrics (`metrics.Endpoint`), and every write of the leader is
    fenced by its renew deadline (`leader`).
    The only HA mode: kopf runs standalone, because kopf's peering pauses only kopf's own watches while the
    informers, the queue and the reconcile threads of a paused replica would go on acting from a frozen
    cache."""
    leader_election_namespace: str | None = dataclasses.field(
        default=None, metadata=_env("KUBETRAIN_LEADER_ELECTION_NAMESPACE")
    )
    leader_election_id: str = dataclasses.field(
        default=leader.DEFAULT_LEASE_NAME, metadata=_env("KUBETRAIN_LEADER_ELECTION_ID")
    )
    allowed_volume_types: list[str] | None = dataclasses.field(
        default=None, metadata=_env("KUBETRAIN_ALLOWED_VOLUME_TYPES")
    )
    """What `spec.storage` may use (`admission`); None allows everything, an empty list nothing."""
    allowed_service_accounts: list[str] | None = dataclasses.field(
        default=None, metadata=_env("KUBETRAIN_ALLOWED_SERVICE_ACCOUNTS")
    )
    kueue: bool = dataclasses.field(default=True, metadata=_env("KUBETRAIN_KUEUE"))
    """Manage the Workloads of TrainingJobs labelled kueue.x-k8s.io/queue-name where Kueue's API is served."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Options:
        """The options the environment sets, each read by its field's type; a value that does not parse
        is refused naming the variable."""
        env = os.environ if env is None else env
        given = {}
        for field in dataclasses.fields(cls):
            variable = field.metadata.get("env")
            if variable is not None and variable in env:
                given[field.name] = _parse(str(field.type), env[variable], variable)
        return cls(**given)

    @classmethod
    def from_args(cls, args: Any) -> Options:
        """The parsed flags of `kubetrain operator` (whose defaults are `from_env`'s), one per field; an
        empty --liveness disables it, and no --namespace falls back to the environment's list."""
        values = {field.name: getattr(args, field.name) for field in dataclasses.fields(cls)}
        values["namespaces"] = args.namespaces or cls.from_env().namespaces
        values["liveness"] = args.liveness or None
        return cls(**values)

    def policy(self) -> admission.Policy:
        """What TrainingJobs may ask for; a list that is not given allows everything."""
        return admission.Policy(
            volume_types=None if self.allowed_volume_types is None else frozenset(self.allowed_volume_types),
            service_accounts=(
                None if self.allowed_service_accounts is None else frozenset(self.allowed_service_accounts)
            ),
        )

    def watched_namespaces(self) -> list[str]:
        if self.all_namespaces:
            return []
        return self.namespaces or [os.environ.get("POD_NAMESPACE", "default")]


def _parse(kind: str, raw: str, variable: str) -> Any:
    """An environment variable's value as a field of type `kind` (the annotation, as written)."""
    if kind == "bool":
        if raw.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
            words = ", ".join(word for word in TRUE_WORDS + FALSE_WORDS if word)
            raise ValueError(f"{variable}={raw!r}: expected true or false (or {words})")
        return raw.strip().lower() in TRUE_WORDS
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{variable}={raw!r}: expected a whole number") from None
    if kind.startswith("list[str]"):
        return [name.strip() for name in raw.split(",") if name.strip()]  # empty: an empty list
    if kind == "str | None":
        return raw or None
    if kind == "str":
        return raw
    raise TypeError(f"no reader for options of type {kind} ({variable})")


_state: dict[str, Any] = {
    "options": Options(),
    "fence": None,
    "standby_health": None,
    "metrics": metrics.Endpoint.create(),
}
"""What `run` hands to kopf's startup handler: the options, the leader's write fence (or None), the
liveness server it answered with while standing by (or None), to close once kopf serves its own, and the
process's metrics endpoint (one per process: `run` serves it before the election, the startup handler
adds the operator's metrics to it)."""

LOG_FORMATS = ("plain", "full", "json")

LOST_LEASE_EXIT_CODE = 1
"""The exit status of a leader that lost its Lease: its Deployment restarts it as a standby."""


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """kopf's settings, then the operator itself: the controller, its informers and API discovery.

    kopf is the process's frame here (startup and cleanup, signals, the liveness endpoint, log format)
    and handles no objects: TrainingJobs and their children come from the `informer` threads, which cost
    a tenth of kopf's per-event CPU (informer's docstring)."""
    options = _state["options"]
    # No resource handlers, so kopf has nothing to watch: no namespace or CRD scans (which a namespaced
    # Role would refuse, retried for about a minute), and no object of its own to post Events about.
    settings.scanning.disabled = True
    settings.posting.enabled = False

    client = kube.Kube(fence=_state["fence"], user_agent=_user_agent())
    identities = None
    if options.worker_cluster_role and options.worker_service_account:
        identities = workeridentity.WorkerIdentities(
            client, options.worker_service_account, options.worker_cluster_role
        )
    # Kueue admits queued TrainingJobs through Workloads (see queueing); a Kueue or gang API installed
    # later is noticed by `discovery.LateAPIs` below, and until then a queued TrainingJob waits, saying so.
    kueue = options.kueue and discover(lambda: client.serves(constants.KUEUE_API), constants.KUEUE_API)
    gang_provider = _discover_gang_provider(client)
    controller = Controller(
        client,
        ClusterCache(),
        defaults=plans.Defaults(
            image=options.default_image,
            service_account=options.worker_service_account,
            resync_seconds=options.resync_seconds,
            policy=options.policy(),
            kueue=kueue,
            gang_provider=gang_provider,
        ),
        metrics=_state["metrics"].lead(),
        workers=options.workers,
        namespaces=None if options.all_namespaces else options.watched_namespaces(),
        worker_identities=identities,
    )
    # Events are posted in the background, after new jobs' workers (see events).
    poster = events.EventPoster(client.create, busy=controller.busy)
    controller.post_event = poster.post
    # TrainingJobs and their children (Services, Jobs, Pods labelled kubetrain.io/job-name).
    watched = informer.informers(
        client,
        controller.cache,
        controller.namespaces,
        on_trainingjob=controller.trainingjob_changed,
        on_child=lambda key: controller.schedule(key, informer.CHILD_EVENT_DELAY),
        kueue=kueue,
    )
    controller.ready.clear()
    for each in watched:
        each.start()
    informer.when_synced(watched, controller.ready.set)
    controller.start()
    late = discovery.LateAPIs(
        client,
        lambda: controller.defaults,
        lambda found: _adopt(controller, watched, found),
        kueue_wanted=options.kueue,
    )
    late.start()
    trimmer = heap.HeapTrimmer(heap.find_malloc_trim())
    trimmer.start()
    memo["controller"] = controller
    memo["events"] = poster
    memo["informers"] = watched
    memo["discovery"] = late
    memo["heap"] = trimmer
    # kopf serves the liveness endpoint right after its startup handlers: the standby's server gives the
    # address up now, so the probes never find it unanswered.
    _close_standby_health()
    logger.info(
        "kubetrain operator watching %s; Kueue %s",
        "all namespaces" if options.all_namespaces else ", ".join(options.watched_namespaces()),
        f"found ({constants.KUEUE_API} served)" if kueue else "not installed",
    )


Answer = TypeVar("Answer")

DISCOVERY_RETRY_SECONDS = (1.0, 2.0, 4.0, 8.0, 15.0)
"""The waits between attempts at an API discovery that failed for a passing reason; the last repeats."""


def discover(ask: Callable[[], Answer], what: str, sleep: Callable[[float], None] = time.sleep) -> Answer:
    """`ask()` again until the API server answers: what it serves decides for good (a job naming no gang
    provider fails when none is served; a queued job waits for a Kueue said to be missing), so a passing
    failure (no connection, 429, 5xx) must never stand for "not served". Other refusals are raised."""
    waits = iter(DISCOVERY_RETRY_SECONDS)
    delay = DISCOVERY_RETRY_SECONDS[0]
    while True:
        try:
            return ask()
        except kube.ApiError as exc:
            if exc.status not in {0, 429} and exc.status < 500:
                raise
            delay = next(waits, delay)
            logger.warning("discovering %s: %s; asking again in %.0fs", what, exc, delay)
            sleep(delay)


def _discover_gang_provider(client: kube.Kube) -> api.GangProvider | None:
    """The gang scheduler for TrainingJobs whose spec.gangScheduling names none: the first this cluster
    serves (gang.default_provider), asked at start until the API server answers; one installed later is
    noticed by `discovery.LateAPIs`."""
    served: dict[str, frozenset[str]] = {}
    for api_version, _ in gang.REQUIRED_RESOURCES.values():
        try:
            served[api_version] = discover(lambda v=api_version: client.served_resources(v), api_version)
        except kube.ApiError as exc:  # discovery is open to every account; say so and carry on without
            logger.warning("cannot discover %s: %s", api_version, exc)
    provider = gang.default_provider(served)
    logger.info("gang scheduling without a provider uses: %s", provider or "none (no gang API served)")
    return provider


def _adopt(controller: Controller, running: list[informer.Informer], found: discovery.Found) -> None:
    """Take in an API installed since start: a gang provider at once for new jobs; Kueue once its
    informers have listed (a Workload must never be created for a job whose Workload is not yet known),
    then every TrainingJob is planned again, so the queued ones get their Workloads."""
    if found.gang_provider is not None:
        controller.defaults = dataclasses.replace(controller.defaults, gang_provider=found.gang_provider)
    if not found.kueue:
        return
    kueue = informer.kueue_informers(
        controller.kube,
        controller.cache,
        controller.namespaces,
        lambda key: controller.schedule(key, informer.CHILD_EVENT_DELAY),
    )
    for each in kueue:
        each.start()
    running += kueue  # stopped at shutdown with the others

    def admit_through_kueue() -> None:
        controller.defaults = dataclasses.replace(controller.defaults, kueue=True)
        for body in controller.cache.trainingjobs():
            meta = body.get("metadata") or {}
            controller.schedule((meta.get("namespace", ""), meta.get("name", "")), 0.0)

    informer.when_synced(kueue, admit_through_kueue)


@kopf.on.cleanup()
def shutdown(memo: Any, **_: Any) -> None:
    late = memo.get("discovery")
    if late is not None:
        late.stop()
    controller = memo.get("controller")
    if controller is not None:
        controller.stop()
    for each in memo.get("informers") or ():
        each.stop()
    poster = memo.get("events")
    if poster is not None:
        poster.stop()
    trimmer = memo.get("heap")
    if trimmer is not None:
        trimmer.stop()


class StopRequested(SystemExit):
    """SIGTERM or SIGINT before kopf handles them, while standing by: stop without leading. A SystemExit,
    so that neither the election's retry loop (`except Exception`) nor asyncio swallows it."""


def _stop_requested(signum: int, _frame: Any) -> None:
    raise StopRequested(0)


def run(options: Options) -> None:
    """Run the operator until SIGTERM/SIGINT (kopf.run with our startup and cleanup and options)."""
    _state["options"] = options
    kopf.configure(verbose=options.verbose, log_format=kopf.LogFormat[options.log_format.upper()])
    if options.metrics_port:
        # From the start, a standby too: a Ready pod is an endpoint of the metrics Service, and a target
        # that does not answer would read as down. The same server serves the leader's metrics later.
        try:
            _state["metrics"].serve(options.metrics_port)
        except OSError as exc:  # metrics are not worth refusing to reconcile over
            logger.warning("cannot serve metrics on port %s: %s", options.metrics_port, exc)
    elector = None
    try:
        if options.leader_elect:
            if threading.current_thread() is threading.main_thread():
                # A standby stops at once when its pod is deleted (a rolling update), instead of ignoring
                # SIGTERM as a container's first process without a handler does until SIGKILL. kopf
                # installs its own handlers when it starts.
                signal.signal(signal.SIGTERM, _stop_requested)
                signal.signal(signal.SIGINT, _stop_requested)
            elector = _elector(options)
            _lead(options, elector)
        _state["fence"] = elector.check if elector is not None else None
        kopf.run(
            clusterwide=options.all_namespaces,
            namespaces=options.watched_namespaces(),
            standalone=True,
            liveness_endpoint=options.liveness,
            memo=kopf.Memo(),
        )
    except StopRequested:
        logger.info("stopping: signalled before leading")
    finally:
        _close_standby_health()
        if elector is not None:
            elector.release()


def identity() -> str:
    """This replica's name in the Lease and in the API server's audit log: the pod's name in a cluster."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _user_agent() -> str:
    return f"kubetrain-operator/{__version__} ({identity()})"


def _elector(options: Options) -> leader.LeaderElector:
    namespace = options.leader_election_namespace or os.environ.get("POD_NAMESPACE", "default")
    client = kube.Kube(user_agent=_user_agent())
    return leader.LeaderElector(client, namespace, identity(), name=options.leader_election_id)


def _lead(options: Options, elector: leader.LeaderElector) -> None:
    """Block until this replica holds the Lease, answering the liveness endpoint meanwhile; end the process
    the moment the Lease is lost."""
    if options.liveness:
        try:
            _state["standby_health"] = health.StandbyHealth(options.liveness, elector.campaigning)
        except OSError as exc:  # another process on this machine has the port: kopf will say so too
            logger.warning("cannot answer liveness at %s while standing by: %s", options.liveness, exc)
    elector.wait_for_leadership()
    elector.keep_renewing(on_lost=lambda: os._exit(LOST_LEASE_EXIT_CODE))


def _close_standby_health() -> None:
    standby_health = _state.pop("standby_health", None)  # once, whichever thread comes first
    if standby_health is not None:
        standby_health.close()
