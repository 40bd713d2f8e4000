"""`python -m kubetrain_trainer.rendezvous_store`: the elastic rendezvous store as a process of its own.

torchrun's c10d rendezvous keeps its state in a TCPStore. Left to itself, torchrun hosts that store in
the agent whose host is the endpoint, so losing that one worker loses the rendezvous and every other
worker with it. An elastic TrainingJob instead runs the store here, in a pod (or, locally, a process)
that trains nothing and so fails for none of the reasons workers fail; every agent is a client
(`is_host=false`). The store holds only rendezvous bookkeeping: losing it is a whole-group restart.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import timedelta


def serve(host: str, port: int) -> None:
    """Host a TCPStore on host:port until SIGTERM or SIGINT."""
    import torch.distributed as dist

    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    store = dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=60)
    )
    print(f"rendezvous store listening on {host}:{store.port}", flush=True)
    stopped.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetrain_trainer.rendezvous_store")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--port", type=int, required=True, help="TCP port (the job's masterPort)")
    args = parser.parse_args(argv)
    serve(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
