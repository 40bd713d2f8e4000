"""The Kueue suite's cluster-wide queueing setup, as docs/kueue.md describes it."""

from __future__ import annotations

from typing import Any

FLAVOR_LABELS = {"kubetrain.io/test-pool": "kueue"}
FLAVOR_TOLERATION = {"key": "kubetrain.io/test-pool", "operator": "Exists", "effect": "NoSchedule"}
QUOTA_CPUS = 4
"""The ClusterQueue's quota: one 4-worker job of 1 CPU per worker."""


def kueue_setup() -> list[dict[str, Any]]:
    """The cluster-wide half of docs/kueue.md's setup: a ResourceFlavor, a ClusterQueue that preempts lower
    priorities, and a WorkloadPriorityClass for the jobs that preempt."""
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "kwok-nodes"},
            "spec": {"nodeLabels": FLAVOR_LABELS, "tolerations": [FLAVOR_TOLERATION]},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "training"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": "kwok-nodes", "resources": [{"name": "cpu", "nominalQuota": QUOTA_CPUS}]}
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "urgent"},
            "value": 1000,
        },
    ]
