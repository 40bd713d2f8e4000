"""Kueue or a gang scheduling API installed after the operator started, noticed without a restart.

At start the operator asks the API server what it serves (`main.discover`). A cluster changes under a
running operator: Kueue or Volcano is installed, an admin enables the Workload API. `LateAPIs` asks again
every `REDISCOVERY_SECONDS` for what was missing, and only for that (once found, an API is kept: its
removal is an admin's act that jobs in flight could not follow anyway):

- Kueue: the Workload and ResourceFlavor informers start, and once they have listed, queued TrainingJobs
  (held with reason KueueNotInstalled) are planned again and get their Workloads.
- A gang API: it becomes the provider of new TrainingJobs whose spec.gangScheduling names none. A job that
  already has one keeps it for its life (status.gangProvider).

A failed question is a warning and is asked again at the next round: it never stands for "not served".
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from kubetrain_operator import api
from kubetrain_operator.api import constants
from kubetrain_operator.planning import gang, plans
from kubetrain_operator.runtime import kube

logger = logging.getLogger("kubetrain.operator")

REDISCOVERY_SECONDS = 60.0
"""How often what the cluster did not serve at start is asked for again: one discovery GET per missing
API a minute, nothing once everything is found."""


def served_gang_provider(client: kube.Kube) -> api.GangProvider | None:
    """The first gang scheduler the cluster serves (gang.default_provider), asked once; an API that cannot
    be asked now counts as not served until the next round."""
    served: dict[str, frozenset[str]] = {}
    for api_version, _ in gang.REQUIRED_RESOURCES.values():
        try:
            served[api_version] = client.served_resources(api_version)
        except kube.ApiError as exc:
            logger.warning(
                "cannot discover %s: %s; asking again in %.0fs", api_version, exc, REDISCOVERY_SECONDS
            )
    return gang.default_provider(served)


@dataclasses.dataclass
class Found:
    """What a round found that the operator did not have."""

    kueue: bool = False
    gang_provider: api.GangProvider | None = None


class LateAPIs:
    """Asks again, in a thread of its own, for the APIs the operator started without.

    `defaults` reads the controller's current plans.Defaults and `on_found` applies what a round found
    (the shell starts Kueue's informers, then swaps the Defaults); `kueue_wanted` is False under
    --no-kueue, where Kueue is never looked for."""

    def __init__(
        self,
        client: kube.Kube,
        defaults: Callable[[], plans.Defaults],
        on_found: Callable[[Found], None],
        *,
        kueue_wanted: bool,
        interval: float = REDISCOVERY_SECONDS,
    ) -> None:
        self.client = client
        self.defaults = defaults
        self.on_found = on_found
        self.kueue_wanted = kueue_wanted
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubetrain-discovery", daemon=True)

    def missing(self) -> bool:
        """Whether anything is still to be looked for."""
        current = self.defaults()
        return (self.kueue_wanted and not current.kueue) or current.gang_provider is None

    def check(self) -> Found:
        """One round: ask for what is missing, hand over what was found."""
        current = self.defaults()
        found = Found()
        if self.kueue_wanted and not current.kueue:
            try:
                found.kueue = self.client.serves(constants.KUEUE_API)
            except kube.ApiError as exc:
                logger.warning(
                    "cannot discover %s: %s; asking again in %.0fs", constants.KUEUE_API, exc, self.interval
                )
        if current.gang_provider is None:
            found.gang_provider = served_gang_provider(self.client)
        if found.kueue:
            logger.info(
                "Kueue found (%s served): queued TrainingJobs are admitted through it", constants.KUEUE_API
            )
        if found.gang_provider is not None:
            logger.info(
                "gang scheduling without a provider uses: %s (installed since start)", found.gang_provider
            )
        if found.kueue:
            # Taken in once: the shell sets Defaults.kueue only when Kueue's informers have listed, and a
            # round before that must not start them again.
            self.kueue_wanted = False
        if found.kueue or found.gang_provider is not None:
            self.on_found(found)
        return found

    def start(self) -> None:
        if self.missing():
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while self.missing() and not self._stopped.wait(self.interval):
            self.check()
