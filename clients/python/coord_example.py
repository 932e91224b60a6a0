#!/usr/bin/env python3
"""Run workers in step with qbroker's barriers and lock from Python.

The example sets a barrier (Barrier service) that holds --workers worker
threads at the start, removes it, and the workers then meet at a double
barrier (DoubleBarrier service) of --workers participants: none starts its
work before all arrived. Each does one step under a lock (Lock service),
printing the grant's fencing token, and leaves the double barrier: none
returns before all left. Each worker's streams are its presence: a worker
that dies leaves the double barrier and releases the lock.

Output, one line per event (workers interleave):
  barrier BARRIER set / removed
  worker I entered KEY
  worker I locked TOKEN / worker I unlocked TOKEN
  worker I left

Errors are told apart by their gRPC status code, as in example.py: exit
status 2 for InvalidArgument (a bad name or count), 1 otherwise. It takes
example.py's TLS and token flags and uses the stubs generated from
api/coord.proto (coord_pb2.py, coord_pb2_grpc.py; `make python`).
"""

import argparse
import queue
import sys
import threading

import grpc

import coord_pb2 as pb
import coord_pb2_grpc as pb_grpc
from example import UsageError, call, log, open_channel

# Serializes the workers' lines.
_print_lock = threading.Lock()


def say(line):
    with _print_lock:
        print(line, flush=True)


class Requests:
    """A stream's request side, fed from a queue.Queue: gRPC reads it in
    its own thread. put(None) half-closes the stream."""

    def __init__(self, first):
        self.q = queue.Queue()
        self.q.put(first)

    def put(self, req):
        self.q.put(req)

    def __iter__(self):
        return self

    def __next__(self):
        req = self.q.get()
        if req is None:
            raise StopIteration
        return req


def expect(events, want, what):
    """Returns the stream's next event, which must be of type want."""
    ev = next(events, None)
    if ev is None or ev.type != want:
        raise RuntimeError(f"{what}: got {ev}, want event type {want}")
    return ev


def locked_step(channel, name, worker, timeout):
    """Takes the lock name on a Lock stream, prints the grant, releases it."""
    reqs = Requests(pb.LockRequest(name=name, value=f"worker {worker}".encode()))
    events = pb_grpc.LockStub(channel).Lock(reqs, timeout=timeout)
    try:
        g = expect(events, pb.LockEvent.TYPE_GRANTED, f"worker {worker}: lock {name}")
        say(f"worker {worker} locked {g.token}")
        # The work under the lock would pass g.token to what it writes.
        say(f"worker {worker} unlocked {g.token}")
        reqs.put(pb.LockRequest(unlock=True))
        for ev in events:  # the stream ends with OK once released
            if ev.type == pb.LockEvent.TYPE_LOST:
                raise RuntimeError(f"worker {worker}: lock {name} lost")
    finally:
        reqs.put(None)
        events.cancel()


def worker(channel, args, i, errors):
    try:
        # Held here until the barrier is removed.
        call(pb_grpc.BarrierStub(channel).Wait, pb.WaitBarrierRequest(name=args.barrier), args.timeout)
        reqs = Requests(pb.DoubleBarrierRequest(name=args.barrier, count=args.workers))
        events = pb_grpc.DoubleBarrierStub(channel).Enter(reqs, timeout=args.timeout)
        try:
            ev = expect(events, pb.DoubleBarrierEvent.TYPE_ENTERED, f"worker {i}: enter {args.barrier}")
            say(f"worker {i} entered {ev.key}")
            locked_step(channel, args.lock, i, args.timeout)
            reqs.put(pb.DoubleBarrierRequest(leave=True))
            expect(events, pb.DoubleBarrierEvent.TYPE_LEFT, f"worker {i}: leave {args.barrier}")
            say(f"worker {i} left")
        finally:
            reqs.put(None)
            events.cancel()
    except (grpc.RpcError, RuntimeError) as err:
        errors.put(err)


def run(args):
    channel = open_channel(args)
    try:
        barriers = pb_grpc.BarrierStub(channel)
        call(barriers.Set, pb.SetBarrierRequest(name=args.barrier), args.timeout)
        say(f"barrier {args.barrier} set")
        errors = queue.Queue()
        threads = [threading.Thread(target=worker, args=(channel, args, i, errors)) for i in range(args.workers)]
        for t in threads:
            t.start()
        call(barriers.Remove, pb.RemoveBarrierRequest(name=args.barrier), args.timeout)
        say(f"barrier {args.barrier} removed")
        for t in threads:
            t.join()
        if not errors.empty():
            raise errors.get()
    finally:
        channel.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:7070", help="broker address (host:port)")
    p.add_argument("--barrier", default="python-example", help="barrier and double barrier name")
    p.add_argument("--lock", default="python-example", help="lock name")
    p.add_argument("--workers", type=int, default=3, help="worker threads, the double barrier's count (1..100)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call and per stream")
    p.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs (implied by --tls-ca)")
    p.add_argument("--tls-ca", help="use TLS, trusting these PEM CA certificates")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS, with --tls-key")
    p.add_argument("--tls-key", help="the client certificate's key (PEM)")
    p.add_argument("--tls-server-name", help="name the broker's certificate must carry; default the host dialled")
    p.add_argument("--token-file", help="file holding a bearer token (or set $QBROKER_TOKEN); needs TLS")
    args = p.parse_args()
    if not 1 <= args.workers <= 100:
        p.error("--workers must be 1..100")
    try:
        run(args)
    except UsageError as err:
        p.error(str(err))
    except grpc.RpcError as err:
        log(f"{err.code().name}: {err.details()}")
        return 2 if err.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
    except RuntimeError as err:
        log(err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
