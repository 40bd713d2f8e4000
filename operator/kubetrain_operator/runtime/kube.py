"""A small synchronous Kubernetes REST client working on plain dicts.

It borrows authentication and TLS from the official `kubernetes` client (kubeconfig or in-cluster
service account, with token refresh) but speaks raw JSON, so manifests built by `builders` go out as they
are and objects come back as the API server wrote them (watch events less their managedFields). Sync on
purpose: the operator calls it from the informer, reconcile and event threads, never from kopf's event
loop.

Bodies are encoded and answers and watch events decoded with orjson: decoding every Job and Pod event was
the largest share of the operator's CPU at 500 jobs (25% in a py-spy profile), and orjson decodes a 4 KB
Pod event in 15 us against the standard library's 33 us. Watch lines are cut from the connection's bytes
by `watchstream`, and their managedFields out of them before parsing. Other requests go over the
keep-alive connections of `connections`, not through urllib3 and http.client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import orjson
import urllib3

from kubetrain_operator.api import constants
from kubetrain_operator.runtime import connections, watchstream

JOB_PATHS = {
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    constants.KIND: (f"/apis/{constants.GROUP}/{constants.VERSION}", constants.PLURAL),
    "Workload": (f"/apis/{constants.KUEUE_API}", "workloads"),
    "ResourceFlavor": (f"/apis/{constants.KUEUE_API}", "resourceflavors"),
}


WATCH_SECONDS = 300
"""How long the API server keeps one watch open before the watcher opens the next (from where it was)."""

POOL_SIZE = 64
"""Keep-alive connections to the API server: at least every thread that may call it at once."""


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def invalid(self) -> bool:
        """The request itself is wrong (422 Invalid, 400 BadRequest): retrying cannot help."""
        return self.status in (400, 422)


def path(
    kind: str,
    namespace: str,
    name: str | None = None,
    subresource: str | None = None,
    api_version: str | None = None,
) -> str:
    """REST path of a namespaced object; api_version picks the group for kinds outside JOB_PATHS."""
    if api_version is not None and (kind not in JOB_PATHS or not JOB_PATHS[kind][0].endswith(api_version)):
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        plural = kind.lower() + "s"
    else:
        prefix, plural = JOB_PATHS[kind]
    out = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
    if name:
        out += f"/{quote(name)}"
    if subresource:
        out += f"/{subresource}"
    return out


def _payload(status: int, reason: Any, data: bytes | None) -> dict[str, Any]:
    """The JSON an answer carries; ApiError with the server's reason and message unless it is a 2xx."""
    data = data or b"{}"
    try:
        payload = orjson.loads(data)
    except ValueError:
        payload = {"message": data.decode(errors="replace")}
    if not 200 <= status < 300:
        raise ApiError(status, payload.get("reason") or str(reason), payload.get("message", ""), payload)
    return payload


def _event(line: bytes) -> dict[str, Any]:
    """One watch event, parsed without its object's managedFields (`watchstream.without_managed_fields`);
    whole if the cut line does not parse."""
    cut = watchstream.without_managed_fields(line)
    if cut is not line:
        try:
            return orjson.loads(cut)
        except ValueError:
            pass
    return orjson.loads(line)


def collection_path(kind: str, namespace: str | None) -> str:
    """REST path of every `kind` in `namespace`, or in all namespaces for None."""
    prefix, plural = JOB_PATHS[kind]
    return f"{prefix}/namespaces/{quote(namespace)}/{plural}" if namespace else f"{prefix}/{plural}"


class Kube:
    """The operations the operator needs, on dicts."""

    def __init__(
        self,
        api_client: Any = None,
        request_timeout: float = 30.0,
        fence: Callable[[], None] | None = None,
        user_agent: str | None = None,
    ) -> None:
        """`fence` is called right before every request that is not a GET and raises to stop it: the
        leader election's check that this replica still leads (`leader.LeaderElector.check`).
        `user_agent` names the caller in the API server's audit log (without `api_client` only)."""
        if api_client is None:
            api_client = make_api_client(user_agent)
        self._client = api_client
        self._timeout = request_timeout
        self._fence = fence
        self._connections = connections.for_client(api_client)
        """Where requests (not watches) go; None: through the client's urllib3 pool."""

    def request(
        self,
        method: str,
        url: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request, answered within `timeout` seconds (default: the client's request timeout)."""
        if self._connections is not None:
            full_url, headers, data = self._prepared(method, url, query or [], body, content_type)
            fence = self._fence if method != "GET" else None
            try:
                answer = self._connections.exchange(
                    method,
                    full_url,
                    headers,
                    data,
                    timeout=self._timeout if timeout is None else timeout,
                    before_send=fence,
                )
            except (OSError, ValueError) as exc:
                raise ApiError(0, type(exc).__name__, str(exc)) from exc
            return _payload(answer.status, answer.reason, answer.data)
        response = self._send(
            method,
            url,
            query=query or [],
            body=body,
            content_type=content_type,
            timeout=self._timeout if timeout is None else timeout,
            preload=True,
        )
        return _payload(response.status, response.reason, response.data)

    def _send(
        self,
        method: str,
        url: str,
        *,
        query: list[tuple[str, str]],
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any,
        preload: bool,
    ) -> Any:
        """One request with the client's authentication; the urllib3 response, read (`preload`) or left to
        stream. Transport-level failures raise ApiError with status 0.

        The official client lends the URL, the headers and the credentials (`param_serialize`, which
        refreshes an expiring token) and its connection pool; the body is encoded here with orjson and
        sent on that pool. Its own `call_api` would walk every manifest to sanitise it (3% of the
        operator's CPU samples when 500 jobs create their Jobs) and encode it again with `json.dumps`."""
        full_url, headers, data = self._prepared(method, url, query, body, content_type)
        limit = (
            urllib3.Timeout(connect=timeout[0], read=timeout[1])
            if isinstance(timeout, tuple)
            else urllib3.Timeout(total=timeout)
        )
        if self._fence is not None and method != "GET":
            self._fence()  # as late as possible: nothing but the send itself comes after it
        try:
            return self._client.rest_client.pool_manager.request(
                method,
                full_url,
                body=data,
                headers=headers,
                timeout=limit,
                preload_content=preload,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from exc

    def _prepared(
        self, method: str, url: str, query: list[tuple[str, str]], body: Any, content_type: str
    ) -> tuple[str, dict[str, str], bytes | None]:
        """The full URL and headers the client serializes (with its credentials: `param_serialize`
        refreshes an expiring token), and the body encoded with orjson."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        _, full_url, headers, _, _ = self._client.param_serialize(
            method=method,
            resource_path=url,
            query_params=query,
            header_params=headers,
            body=None,
            auth_settings=["BearerToken"],
        )
        return full_url, headers, None if body is None else orjson.dumps(body)

    # --- objects

    def get(
        self,
        kind: str,
        namespace: str,
        name: str,
        api_version: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any] | None:
        try:
            return self.request("GET", path(kind, namespace, name, api_version=api_version), timeout=timeout)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def served_resources(self, api_version: str) -> frozenset[str]:
        """The resources (not subresources) the API server serves in a group version, from discovery;
        empty when it serves no such group version."""
        try:
            answer = self.request("GET", f"/apis/{api_version}")
        except ApiError as exc:
            if exc.not_found:
                return frozenset()
            raise
        return frozenset(r["name"] for r in answer.get("resources") or () if "/" not in r.get("name", "/"))

    def watch(
        self,
        kind: str,
        namespace: str | None,
        label_selector: str | None,
        resource_version: str,
        timeout_seconds: int = WATCH_SECONDS,
    ) -> Iterator[dict[str, Any]]:
        """The watch events of `kind` after `resource_version`, as parsed dicts, as they arrive; ends when
        the server closes the stream (after about `timeout_seconds`). Raises ApiError when refused and on
        transport errors (status 0), like `request`."""
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ] + ([("labelSelector", label_selector)] if label_selector else [])
        url = collection_path(kind, namespace)
        stream = self._send("GET", url, query=query, timeout=(10.0, timeout_seconds + 30.0), preload=False)
        try:
            if not 200 <= stream.status < 300:
                _payload(stream.status, stream.reason, stream.read())  # raises the server's error
            for line in watchstream.lines(stream):
                if line.strip():
                    yield _event(line)
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            raise ApiError(0, "WatchBroken", f"{kind} watch stream broke: {exc}") from exc
        finally:
            stream.close()  # read past http.client (`watchstream`), or left unfinished: never reused
            stream.release_conn()

    def list_pages(
        self, kind: str, namespace: str | None, label_selector: str | None = None, limit: int = 500
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        """Every object of `kind` (in `namespace`, or everywhere for None), one page of at most `limit` at
        a time, each with the listing's resourceVersion (one consistent snapshot across pages)."""
        url = collection_path(kind, namespace)
        query = [("limit", str(limit))] + ([("labelSelector", label_selector)] if label_selector else [])
        token = ""
        while True:
            answer = self.request("GET", url, query=query + ([("continue", token)] if token else []))
            for item in answer.get("items") or []:  # a list's items carry no kind of their own
                item.setdefault("kind", kind)
            yield answer.get("items") or [], answer.get("metadata", {}).get("resourceVersion", "")
            token = answer.get("metadata", {}).get("continue") or ""
            if not token:
                return

    def create(self, manifest: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        namespace = manifest["metadata"]["namespace"]
        return self.request(
            "POST",
            path(manifest["kind"], namespace, api_version=manifest.get("apiVersion")),
            query=[("fieldManager", constants.FIELD_MANAGER)],
            body=manifest,
            timeout=timeout,
        )

    def replace(self, manifest: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """PUT the whole object; its metadata.resourceVersion makes a concurrent change fail with 409."""
        meta = manifest["metadata"]
        return self.request(
            "PUT",
            path(manifest["kind"], meta["namespace"], meta["name"], api_version=manifest.get("apiVersion")),
            query=[("fieldManager", constants.FIELD_MANAGER)],
            body=manifest,
            timeout=timeout,
        )

    def delete(
        self,
        kind: str,
        namespace: str,
        name: str,
        propagation: str = "Background",
        uid: str | None = None,
        *,
        api_version: str | None = None,
    ) -> None:
        """Delete the object; with `uid`, only that very object (a uid precondition), never a namesake
        created since it was read. Gone already, or replaced by a namesake (409), is success."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path(kind, namespace, name, api_version=api_version), body=body)
        except ApiError as exc:
            if not (exc.not_found or (uid and exc.conflict)):
                raise

    def serves(self, api_version: str) -> bool:
        """Whether the API server serves `api_version` (group/version), e.g. an installed CRD's."""
        try:
            self.request("GET", f"/apis/{api_version}")
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch an object (or its `subresource`); with resource_version, fail on a stale read."""
        if resource_version:
            body = {**body, "metadata": {"resourceVersion": resource_version}}
        return self.request(
            "PATCH",
            path(kind, namespace, name, subresource),
            query=[("fieldManager", constants.FIELD_MANAGER)],
            body=body,
            content_type="application/merge-patch+json",
        )

    def apply_status(
        self, kind: str, namespace: str, name: str, api_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Server-side apply `status` to an object's status subresource under the operator's field
        manager: the fields named are the operator's from then on (forced: a field another manager set
        before is taken over), and a list of the object's schema keyed by a field (conditions by type)
        keeps the entries other managers own."""
        body = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return self.request(
            "PATCH",
            path(kind, namespace, name, "status", api_version=api_version),
            query=[("fieldManager", constants.FIELD_MANAGER), ("force", "true")],
            body=body,
            content_type="application/apply-patch+yaml",
        )

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the TrainingJob's status subresource; with resource_version, fail on a stale read."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request(
            "PATCH",
            path(constants.KIND, namespace, name, "status"),
            query=[("fieldManager", constants.FIELD_MANAGER)],
            body=body,
            content_type="application/merge-patch+json",
        )


def make_api_client(user_agent: str | None = None) -> Any:
    """An ApiClient from the in-cluster service account, else from the kubeconfig. `user_agent` names the
    caller in the API server's audit log (the operator puts its replica identity there)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # The default pool (5 x CPUs) is smaller than the threads calling the API (the reconcile threads, the
    # creators, the informers): the overflow would open a TLS connection per request and discard it.
    configuration.connection_pool_maxsize = POOL_SIZE
    api_client = client.ApiClient(configuration)
    if user_agent is not None:
        api_client.user_agent = user_agent
    return api_client
