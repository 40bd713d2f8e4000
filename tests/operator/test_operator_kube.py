"""The REST layer: paths for every kind the operator touches, bodies as dicts, errors by status code."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubetrain_operator.runtime import kube

pytestmark = pytest.mark.unit


class _Response:
    def __init__(self, status: int, payload: Any) -> None:
        self.status = status
        self.reason = "Reason"
        self.data = json.dumps(payload).encode()


class _Pool:
    """Answers like the urllib3 pool the kubernetes client lends, recording each body as sent."""

    def __init__(self, api: FakeApiClient) -> None:
        self.api = api

    def request(self, method: str, url: str, *, body: bytes | None, headers: Any, **_: Any) -> _Response:
        self.api.requests[-1]["body"] = None if body is None else json.loads(body)
        status, payload = self.api.answers.pop(0)
        return _Response(status, payload)


class FakeApiClient:
    """Records requests like kubernetes.client.ApiClient's param_serialize and the pool it sends on."""

    def __init__(self, answers: list[tuple[int, Any]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []
        self.rest_client = type("RestClient", (), {"pool_manager": _Pool(self)})()

    def param_serialize(
        self,
        *,
        method: str,
        resource_path: str,
        query_params: Any,
        header_params: Any,
        body: Any,
        auth_settings: Any,
    ) -> tuple[Any, ...]:
        assert body is None  # the body is encoded by kube, never walked by the client
        self.requests.append(
            {"method": method, "path": resource_path, "query": query_params, "headers": header_params}
        )
        return method, "https://api" + resource_path, header_params, body, None


@pytest.mark.parametrize(
    ("kind", "api_version", "expected"),
    [
        ("Job", None, "/apis/batch/v1/namespaces/ns/jobs/x"),
        ("Pod", None, "/api/v1/namespaces/ns/pods/x"),
        ("Service", "v1", "/api/v1/namespaces/ns/services/x"),
        ("TrainingJob", None, "/apis/kubetrain.io/v1alpha1/namespaces/ns/trainingjobs/x"),
        ("Lease", None, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/x"),
        (
            "PodGroup",
            "scheduling.volcano.sh/v1beta1",
            "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/x",
        ),
        (
            "PodGroup",
            "scheduling.x-k8s.io/v1alpha1",
            "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/x",
        ),
    ],
)
def test_paths(kind: str, api_version: str | None, expected: str) -> None:
    assert kube.path(kind, "ns", "x", api_version=api_version) == expected


def test_status_patch_is_a_merge_patch_guarded_by_resource_version() -> None:
    client = FakeApiClient([(200, {"status": {}})])
    kube.Kube(client).patch_status("ns", "demo", {"phase": "Running"}, "42")
    request = client.requests[0]
    assert request["method"] == "PATCH"
    assert request["path"].endswith("/trainingjobs/demo/status")
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["body"] == {"status": {"phase": "Running"}, "metadata": {"resourceVersion": "42"}}


@pytest.mark.parametrize(
    ("status", "flag"), [(404, "not_found"), (409, "conflict"), (422, "invalid"), (400, "invalid")]
)
def test_errors_carry_the_servers_reason_and_message(status: int, flag: str) -> None:
    client = FakeApiClient([(status, {"reason": "Why", "message": "spec.x: bad"})])
    with pytest.raises(kube.ApiError) as caught:
        kube.Kube(client).create(
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"}}
        )
    assert getattr(caught.value, flag)
    assert caught.value.message == "spec.x: bad"


def test_get_of_a_missing_object_is_none_and_delete_of_one_is_fine() -> None:
    client = FakeApiClient([(404, {}), (404, {})])
    api = kube.Kube(client)
    assert api.get("Service", "ns", "x") is None
    api.delete("Job", "ns", "x", "Foreground")
    assert client.requests[1]["body"]["propagationPolicy"] == "Foreground"


def test_a_pod_group_is_deleted_in_its_own_api_group() -> None:
    client = FakeApiClient([(200, {})])
    kube.Kube(client).delete("PodGroup", "ns", "demo-r0", api_version="scheduling.k8s.io/v1beta1")
    assert client.requests[0]["path"] == "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/demo-r0"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            (
                200,
                {"resources": [{"name": "podgroups"}, {"name": "podgroups/status"}, {"name": "workloads"}]},
            ),
            {"podgroups", "workloads"},
        ),
        ((404, {}), set()),
    ],
)
def test_discovery_names_the_served_resources_without_subresources(
    answer: tuple[int, dict[str, Any]], expected: set[str]
) -> None:
    client = FakeApiClient([answer])
    assert kube.Kube(client).served_resources("scheduling.k8s.io/v1beta1") == expected
    assert client.requests[0]["path"] == "/apis/scheduling.k8s.io/v1beta1"


def test_list_pages_follows_continue_tokens_across_all_namespaces() -> None:
    pod = {"metadata": {"name": "p"}}
    api = FakeApiClient(
        [
            (200, {"metadata": {"resourceVersion": "7", "continue": "next"}, "items": [pod, pod]}),
            (200, {"metadata": {"resourceVersion": "7"}, "items": [pod]}),
        ]
    )
    pages = list(kube.Kube(api).list_pages("Pod", None, "kubetrain.io/job-name", limit=2))
    assert [(len(items), version) for items, version in pages] == [(2, "7"), (1, "7")]
    assert pages[0][0][0]["kind"] == "Pod"  # list items carry no kind of their own
    assert [r["path"] for r in api.requests] == ["/api/v1/pods", "/api/v1/pods"]
    assert ("continue", "next") in api.requests[1]["query"]
    assert ("labelSelector", "kubetrain.io/job-name") in api.requests[0]["query"]


def test_a_delete_names_the_uid_it_means_and_a_namesake_in_its_place_is_left_alone() -> None:
    """The API server answers a uid precondition that no longer holds with 409: the object meant is gone
    (a namesake took its place), which is what the caller wanted."""
    precondition_failed = {"reason": "Conflict", "message": "Precondition failed: UID in precondition: a"}
    client = FakeApiClient([(409, precondition_failed), (200, {})])
    api = kube.Kube(client)
    api.delete("TrainingJob", "ns", "demo", "Background", uid="a")
    assert client.requests[0]["body"]["preconditions"] == {"uid": "a"}
    api.delete("Job", "ns", "demo-r0-w0", "Foreground")
    assert "preconditions" not in client.requests[1]["body"]
