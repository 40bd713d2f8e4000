"""The workers' ServiceAccount, provisioned on demand in each namespace where a TrainingJob runs.

Why: rank 0 reports live progress (EPOCH, TRAIN-LOSS in `kubectl get`) by patching its own pod's
`kubetrain.io/progress` annotation, which needs a ServiceAccount allowed to patch pods. An operator that
watches every namespace cannot have that account created up front (the chart does not know where jobs
will run), so with `--worker-cluster-role` the operator creates, the first time it creates workers in a
namespace, the ServiceAccount `--worker-service-account` and a RoleBinding of that ClusterRole (the
chart's: `patch` on pods, narrowed by its ValidatingAdmissionPolicy to the progress annotation of the
caller's own pod) to it. What the operator may do for that is as small as RBAC allows: `create` on
serviceaccounts and rolebindings (nothing else on them: no get, list, update or delete), and `get` and
`bind` on that one ClusterRole, so the only grant it can hand out beyond its own is the workers' one.

Both objects are owned by the ClusterRole (a namespaced dependent may have a cluster-scoped owner), so
`helm uninstall`, which deletes the ClusterRole, has the garbage collector remove them everywhere. An
existing object of the same name (the chart's, or one an earlier operator run made) is left as it is.
"""

from __future__ import annotations

import threading
from typing import Any

from kubetrain_operator.api import constants
from kubetrain_operator.runtime import kube

RBAC_API = "rbac.authorization.k8s.io/v1"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "worker"


def build_worker_identity(
    namespace: str, service_account: str, cluster_role: str, cluster_role_uid: str
) -> list[dict[str, Any]]:
    """The ServiceAccount and the RoleBinding that gives it `cluster_role` in `namespace`."""
    metadata = {
        "namespace": namespace,
        "labels": {constants.LABEL_MANAGED_BY: constants.MANAGED_BY, COMPONENT_LABEL: COMPONENT},
        # No blockOwnerDeletion: deleting the ClusterRole must never wait for these.
        "ownerReferences": [
            {"apiVersion": RBAC_API, "kind": "ClusterRole", "name": cluster_role, "uid": cluster_role_uid}
        ],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, **metadata},
        },
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": {"name": cluster_role, **metadata},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]


class WorkerIdentities:
    """Creates the workers' identity once per namespace per operator run (two requests per namespace:
    a restarted operator answers its 409s once, then asks nothing)."""

    def __init__(self, client: kube.Kube, service_account: str, cluster_role: str) -> None:
        self.client = client
        self.service_account = service_account
        self.cluster_role = cluster_role
        self._ready: set[str] = set()
        self._role_uid: str | None = None
        self._lock = threading.Lock()

    def ensure(self, namespace: str) -> None:
        """Make sure `namespace` has the account; raises kube.ApiError when it cannot be created."""
        with self._lock:
            if namespace in self._ready:
                return
            for manifest in build_worker_identity(
                namespace, self.service_account, self.cluster_role, self._cluster_role_uid()
            ):
                try:
                    self.client.create(manifest)
                except kube.ApiError as exc:
                    if not exc.conflict:
                        raise
            self._ready.add(namespace)

    def _cluster_role_uid(self) -> str:
        if self._role_uid is None:
            try:
                role = self.client.request("GET", f"/apis/{RBAC_API}/clusterroles/{self.cluster_role}")
            except kube.ApiError as exc:
                if not exc.not_found:
                    raise
                raise kube.ApiError(
                    404,
                    "NotFound",
                    f"ClusterRole {self.cluster_role} (--worker-cluster-role) does not exist: install the "
                    "chart's, or run the operator without --worker-cluster-role",
                ) from exc
            self._role_uid = role["metadata"]["uid"]
        return self._role_uid
