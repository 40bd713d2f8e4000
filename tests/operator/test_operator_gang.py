"""Which gang scheduler a TrainingJob gets (gang): the default from what the cluster serves."""

from __future__ import annotations

import pytest
from kubetrain_operator import api
from kubetrain_operator.planning import gang
from operator_fakes import trainer_spec

pytestmark = pytest.mark.unit

WORKLOAD_API = {"scheduling.k8s.io/v1beta1": frozenset({"workloads", "podgroups"})}
VOLCANO = {"scheduling.volcano.sh/v1beta1": frozenset({"podgroups", "queues"})}
COSCHEDULING = {"scheduling.x-k8s.io/v1alpha1": frozenset({"podgroups", "elasticquotas"})}


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ({**COSCHEDULING, **VOLCANO, **WORKLOAD_API}, "kubernetes"),
        ({**COSCHEDULING, **VOLCANO}, "volcano"),
        (COSCHEDULING, "scheduler-plugins"),
        # GenericWorkload on without PodGroup served (a resource disabled by --runtime-config) is no gang.
        ({"scheduling.k8s.io/v1beta1": frozenset({"workloads"})}, None),
        ({"scheduling.k8s.io/v1": frozenset({"priorityclasses"})}, None),
        ({}, None),
    ],
)
def test_the_default_provider_is_the_first_whose_api_the_cluster_serves(
    served: dict[str, frozenset[str]], expected: str | None
) -> None:
    assert gang.default_provider(served) == expected


@pytest.mark.parametrize(
    ("gang_scheduling", "default", "expected"),
    [
        (None, "kubernetes", None),
        ({}, "kubernetes", "kubernetes"),
        ({}, None, None),
        ({"provider": "volcano"}, "kubernetes", "volcano"),
        ({"provider": "volcano"}, None, "volcano"),
    ],
)
def test_a_named_provider_wins_over_the_clusters_default(
    gang_scheduling: dict[str, str] | None, default: api.GangProvider | None, expected: str | None
) -> None:
    spec = api.TrainingJobSpec.model_validate(trainer_spec(gangScheduling=gang_scheduling))
    assert gang.provider(spec, default) == expected
    assert (gang.missing_provider(spec, default) is None) == (gang_scheduling is None or expected is not None)
