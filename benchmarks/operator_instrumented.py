"""Run `kubetrain operator ...` with every API request it makes counted, for benchmarks/operator_scale.py.

    python benchmarks/operator_instrumented.py COUNTS.json [PROFILE.prof] -- operator --namespace NS ...

The operator talks to the API server through three request paths: kopf's aiohttp session (its start-up
API discovery only: kopf handles no objects), kubetrain's own `kube.Kube` on the `kubernetes` package's
urllib3 pool (the informers' lists and watches of TrainingJobs, Services, Jobs and Pods) and `kube.Kube` on
the operator's own keep-alive connections (`runtime/connections.py`: every other request, such as child
creations and deletions, status patches, events). Each is wrapped at its single request entry point
(`aiohttp.ClientSession._request`, `urllib3.HTTPConnectionPool.urlopen`, `Connections.exchange`) and
counted by (client, verb, resource), where verb is what the API server would log: get, list, watch,
create, patch, update, delete. New TLS connections of both pools are counted too (connection churn is
costly).
The counts are written to COUNTS.json twice a second and at exit. With PROFILE.prof, the main thread
runs under cProfile and the profile is written at exit (SIGTERM or SIGINT): kopf's event loop, idle
since kopf handles no objects; py-spy (benchmarks/results/operator-profile-n500.md) sees every thread.

With KUBETRAIN_BENCH_STATE=PATH (benchmarks/operator_soak.py), the sizes of every per-object structure the
process keeps are written to PATH every KUBETRAIN_BENCH_STATE_SECONDS (default 30): the controller's
per-key dicts and delay heap, the cache's dicts, the event poster's queue, the metrics' label sets, the
operator's idle keep-alive connections, threads, and the number of objects the garbage collector tracks.
A soak reads them to tell which of them, if any, grows with the objects that went rather than the
objects alive.

Counting in the process, not from the API server's metrics, is deliberate: `apiserver_request_total`
has no user label, so it mixes the operator with the controller manager, the scheduler, kwok and the
benchmark's own watchers.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import functools
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

_counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
_seconds: collections.Counter[tuple[str, str, str]] = collections.Counter()
_lock = threading.Lock()
_PATH = re.compile(
    r"^/(?:api|apis/[^/]+)/[^/]+(?:/namespaces/[^/]+)?/(?P<resource>[^/?]+)(?P<name>/[^/?]+)?(?P<sub>/[^/?]+)?"
)


def classify(method: str, url: str) -> tuple[str, str]:
    """(verb, resource[/subresource]) as the API server's audit log would name them."""
    path, _, query = url.partition("?")
    if "://" in path:
        path = "/" + path.split("://", 1)[1].split("/", 1)[1]
    match = _PATH.match(path)
    resource = "other"
    named = False
    if match:
        resource = match.group("resource")
        named = bool(match.group("name"))
        if resource == "namespaces" and match.group("sub"):
            resource = "namespaces"
        if match.group("sub"):
            resource += match.group("sub")
    method = method.upper()
    if method == "GET":
        verb = "watch" if re.search(r"(^|&)watch=(1|true)", query) else ("get" if named else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method)
    return verb, resource


def _count(client: str, method: str, url: str, seconds: float = 0.0) -> None:
    verb, resource = classify(method, url)
    with _lock:
        _counts[(client, verb, resource)] += 1
        _seconds[(client, verb, resource)] += seconds


def _counted_requests(original: Any) -> Any:
    """`original` (a method taking the HTTP method and URL first), counting each call with its time."""

    def request(self, method, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            return original(self, method, url, *args, **kwargs)
        finally:
            _count("kube", method, url, time.monotonic() - started)

    return request


def _counted_connects(original: Any) -> Any:
    """`original` (a method opening a new TLS connection), counting each call."""

    def connect(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with _lock:
            _counts[("kube", "tls-connect", "-")] += 1
        return original(self, *args, **kwargs)

    return connect


def _install() -> None:
    import aiohttp
    import urllib3.connectionpool
    from kubetrain_operator.runtime import connections

    pool = urllib3.connectionpool.HTTPConnectionPool
    pool.urlopen = _counted_requests(pool.urlopen)  # type: ignore[method-assign]
    tls_pool = urllib3.connectionpool.HTTPSConnectionPool
    tls_pool._new_conn = _counted_connects(tls_pool._new_conn)  # type: ignore[method-assign]
    own = connections.Connections
    own.exchange = _counted_requests(own.exchange)  # type: ignore[method-assign]
    own._connect = _counted_connects(own._connect)  # type: ignore[method-assign]

    original_request = aiohttp.ClientSession._request

    async def request(self, method, str_or_url, *args, **kwargs):  # type: ignore[no-untyped-def]
        url = str(str_or_url)
        params = kwargs.get("params")
        if params:
            url += ("&" if "?" in url else "?") + "&".join(f"{k}={v}" for k, v in dict(params).items())
        _count("kopf", method, url)
        return await original_request(self, method, str_or_url, *args, **kwargs)

    aiohttp.ClientSession._request = request  # type: ignore[method-assign]


def _dump(path: str) -> None:
    with _lock:
        rows = [
            {"client": c, "verb": v, "resource": r, "count": n, "seconds": round(_seconds[(c, v, r)], 3)}
            for (c, v, r), n in sorted(_counts.items())
        ]
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"time": time.time(), "requests": rows}))
    tmp.replace(path)


def _dump_tracemalloc(path: str) -> None:
    import tracemalloc

    current, peak = tracemalloc.get_traced_memory()
    snapshot = tracemalloc.take_snapshot()
    lines = [f"traced now {current / 2**20:.1f} MiB, traced peak {peak / 2**20:.1f} MiB"]
    for stat in snapshot.statistics("traceback")[:15]:
        lines.append(f"{stat.size / 2**20:.2f} MiB in {stat.count} blocks")
        lines.extend(f"    {line}" for line in stat.traceback.format()[-8:])
    Path(path).write_text("\n".join(lines) + "\n")


def _tracer(path: str, baseline_after: float) -> None:
    """A snapshot whenever the traced heap is 10% above the largest seen so far; and, from
    `baseline_after` seconds on, what grew since a snapshot taken then (`<path>.growth`, every 5 minutes):
    a leak in Python's heap shows there by its allocation site even when it is a few bytes per job."""
    import tracemalloc

    largest = 0
    started = time.monotonic()
    baseline = None
    compared = 0.0
    while True:
        time.sleep(3)
        current, _ = tracemalloc.get_traced_memory()
        if current > largest * 1.1:
            largest = current
            _dump_tracemalloc(path)
        now = time.monotonic()
        if baseline is None and now - started >= baseline_after:
            baseline, compared = tracemalloc.take_snapshot(), now
        elif baseline is not None and now - compared >= 300:
            compared = now
            _dump_growth(f"{path}.growth", baseline, now - started)


def _dump_growth(path: str, baseline: Any, elapsed: float) -> None:
    import tracemalloc

    snapshot = tracemalloc.take_snapshot()
    growth = snapshot.compare_to(baseline, "traceback")
    total = sum(stat.size_diff for stat in growth)
    lines = [f"at {elapsed / 60:.1f} min: traced heap {total / 2**20:+.2f} MiB since the baseline"]
    for stat in growth[:20]:
        lines.append(f"{stat.size_diff / 2**10:+.1f} KiB in {stat.count_diff:+d} blocks")
        lines.extend(f"    {line}" for line in stat.traceback.format()[-8:])
    Path(path).write_text("\n".join(lines) + "\n")


_instances: dict[str, list[Any]] = collections.defaultdict(list)


def _keep_instances(cls: Any, name: str) -> None:
    """Remember every instance of `cls` (the operator makes one of each) for `_state`."""
    original = cls.__init__

    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        _instances[name].append(self)

    cls.__init__ = init


def _state() -> dict[str, Any]:
    import gc
    import tracemalloc

    out: dict[str, Any] = {"time": time.time(), "threads": threading.active_count()}
    for controller in _instances["controller"]:
        out["controller"] = controller.state_sizes()
        out["label_sets"] = sum(len(metric.samples) for metric in controller.metrics.registry.collect())
    for cache in _instances["cache"]:
        with cache._lock:
            out["cache"] = {
                "trainingjobs": len(cache._trainingjobs),
                "placed": len(cache._placed),
                **{f"{kind}_groups": len(groups) for kind, groups in cache._children.items()},
                **{
                    f"{kind}_objects": sum(map(len, groups.values()))
                    for kind, groups in cache._children.items()
                },
            }
    for poster in _instances["poster"]:
        out["event_queue"] = poster._queue.qsize()
    out["idle_connections"] = sum(len(pool._idle) for pool in _instances["connections"])
    for trimmer in _instances["heap"]:
        out["heap_trims"] = {"count": trimmer.trims, "seconds": round(trimmer.trim_seconds, 4)}
    out["gc_objects"] = len(gc.get_objects())
    out["python_blocks"] = sys.getallocatedblocks()
    out["malloc"] = _malloc_figures()
    if tracemalloc.is_tracing():  # its own traces are malloc's too: subtract them from `in_use`
        out["tracemalloc_overhead"] = tracemalloc.get_tracemalloc_memory()
    return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any:
    """glibc's `mallinfo2`, looked up once (the state samples call it every 30 s)."""
    function = ctypes.CDLL(None).mallinfo2
    function.restype = _MallInfo2
    return function


def _malloc_figures() -> dict[str, int]:
    """glibc's own account (mallinfo2): bytes in use, free but kept in the arenas, and mapped for large
    blocks. RSS that grows while `in_use` stays flat is the allocator's keeping, not a leak."""
    info = _mallinfo2()()
    return {
        "in_use": info.uordblks + info.hblkhd,
        "free_kept": info.fordblks,
        "mapped": info.hblkhd,
        "arena": info.arena,
    }


def _time_trims(cls: Any) -> None:
    """Count each trimmer's trims and the seconds they took (`trims`, `trim_seconds`): the trim's cost."""
    original = cls.__init__

    def init(self, trim, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.trims, self.trim_seconds = 0, 0.0

        def timed(pad: int) -> int:
            began = time.perf_counter()
            try:
                return trim(pad)
            finally:
                self.trim_seconds += time.perf_counter() - began
                self.trims += 1

        original(self, timed if trim is not None else None, *args, **kwargs)

    cls.__init__ = init


def _state_dumper(path: str, every: float) -> None:
    while True:
        time.sleep(every)
        try:
            line = json.dumps(_state())
        except Exception as exc:  # a dict resized while read: the next sample reads it again
            line = json.dumps({"time": time.time(), "error": repr(exc)})
        with Path(path).open("a") as out:
            out.write(line + "\n")


def _dumper(path: str) -> None:
    while True:
        time.sleep(0.5)
        _dump(path)


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    own, operator_argv = args[:split], args[split + 1 :]
    counts_path = own[0]
    profile_path = own[1] if len(own) > 1 else None
    _install()
    atexit.register(_dump, counts_path)
    threading.Thread(target=_dumper, args=(counts_path,), daemon=True).start()

    state_path = os.environ.get("KUBETRAIN_BENCH_STATE")
    if state_path:
        from kubetrain_operator.runtime import cache, connections, controller, events, heap

        _keep_instances(controller.Controller, "controller")
        _keep_instances(cache.ClusterCache, "cache")
        _keep_instances(events.EventPoster, "poster")
        _keep_instances(connections.Connections, "connections")
        _keep_instances(heap.HeapTrimmer, "heap")
        _time_trims(heap.HeapTrimmer)
        every = float(os.environ.get("KUBETRAIN_BENCH_STATE_SECONDS", "30"))
        threading.Thread(target=_state_dumper, args=(state_path, every), daemon=True).start()

    trace_path = os.environ.get("KUBETRAIN_BENCH_TRACEMALLOC")
    if trace_path:  # where the Python heap goes: the top allocation sites at exit, and the traced peak
        import tracemalloc

        tracemalloc.start(8)
        baseline_after = float(os.environ.get("KUBETRAIN_BENCH_TRACEMALLOC_BASELINE_SECONDS", "600"))
        threading.Thread(target=_tracer, args=(trace_path, baseline_after), daemon=True).start()

    from kubetrain_operator import cli

    if profile_path:
        import cProfile

        profiler = cProfile.Profile()
        atexit.register(profiler.dump_stats, profile_path)
        profiler.enable()
    sys.exit(cli.main(operator_argv))


if __name__ == "__main__":
    main()
