#!/usr/bin/env python3
"""Publish, consume and ack against a qbroker broker from Python.

The example creates a queue (idempotent), publishes --count messages in one
atomic batch, consumes them at least once on a Consume stream, acking each
delivery on the stream, and prints the queue's counts at the end.

Errors are told apart by their gRPC status code (api/queue.proto lists
them): Unavailable and Aborted are retried with backoff, the rest end the
program with the code and the broker's message on stderr (exit status 2 for
InvalidArgument, a bad request; 1 otherwise).

With --tls-ca (or --tls, trusting the system's CAs) it dials over TLS,
with --tls-cert and --tls-key presenting a client certificate (mutual TLS),
and with --token-file (or $QBROKER_TOKEN) it sends a bearer token with every
call, as the qbroker command's flags of the same names do. A token needs
TLS: sent in the clear it could be replayed by anyone who saw it.

It uses the stubs generated from api/queue.proto (queue_pb2.py,
queue_pb2_grpc.py, beside this file; `make python` rebuilds them).
"""

import argparse
import os
import queue
import sys
import time

import grpc

import queue_pb2 as pb
import queue_pb2_grpc as pb_grpc

# Codes worth retrying: the broker lost ZooKeeper or is shutting down
# (Unavailable), or a claim lost to other consumers too often (Aborted).
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)

# Deliveries the broker may send ahead of our acks.
PREFETCH = 16


def log(*args):
    print("example:", *args, file=sys.stderr, flush=True)


def call(method, request, timeout, attempts=5):
    """Calls a unary method, retrying Unavailable and Aborted with backoff.

    A Publish that failed Unavailable may or may not have been applied:
    retrying it can publish the messages twice, which at-least-once
    consumers must tolerate anyway.
    """
    delay = 0.1
    for attempt in range(1, attempts + 1):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE or attempt == attempts:
                raise
            log(f"{err.code().name}: {err.details()}; retrying in {delay:.1f}s")
            time.sleep(delay)
            delay = min(2 * delay, 2.0)


def consume(stub, name, count, timeout):
    """Receives count messages on one at-least-once Consume stream, acking
    each on the stream, and returns them in delivery order.

    The stream asks for exactly count deliveries (prefetch, then one credit
    per ack), then half-closes: the broker applies every ack sent before
    the half-close, then ends the stream with OK.
    """
    outbox = queue.Queue()

    def requests():
        yield pb.ConsumeRequest(subscribe=pb.Subscribe(
            queue=name,
            mode=pb.DELIVERY_MODE_AT_LEAST_ONCE,
            prefetch=min(PREFETCH, count)))
        while True:
            req = outbox.get()
            if req is None:
                return
            yield req

    granted = min(PREFETCH, count)
    got = []
    stream = stub.Consume(requests(), timeout=timeout)
    try:
        for delivery in stream:
            m = delivery.message
            got.append(m)
            credit = 0
            if granted < count:
                credit, granted = 1, granted + 1
            outbox.put(pb.ConsumeRequest(
                credit=credit, settle=[pb.Settle(ack_token=m.ack_token)]))
            if len(got) == count:
                outbox.put(None)
    finally:
        # Ends the request iterator however the stream ended, so that
        # gRPC's thread reading it does not wait forever.
        outbox.put(None)
    if len(got) < count:
        raise RuntimeError(f"stream ended after {len(got)} of {count} messages")
    return got


def read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise UsageError(f"{what}: {err}") from err


class UsageError(Exception):
    """A bad command line: exit status 2."""


def open_channel(args):
    """Returns a channel to args.addr: over TLS when a TLS flag is given,
    carrying the bearer token when one is."""
    token = os.environ.get("QBROKER_TOKEN", "")
    if args.token_file:
        token = read_file(args.token_file, "--token-file").decode().strip()
    use_tls = args.tls or args.tls_ca or args.tls_cert
    if token and not use_tls:
        raise UsageError("a bearer token (--token-file or $QBROKER_TOKEN) needs TLS: give --tls-ca (or --tls)")
    if not use_tls:
        return grpc.insecure_channel(args.addr)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    creds = grpc.ssl_channel_credentials(
        root_certificates=read_file(args.tls_ca, "--tls-ca") if args.tls_ca else None,
        private_key=read_file(args.tls_key, "--tls-key") if args.tls_key else None,
        certificate_chain=read_file(args.tls_cert, "--tls-cert") if args.tls_cert else None)
    if token:
        # "authorization: Bearer <token>" with every call.
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    options = []
    if args.tls_server_name:
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    return grpc.secure_channel(args.addr, creds, options=options)


def run(args):
    channel = open_channel(args)
    try:
        stub = pb_grpc.QueueStub(channel)
        try:
            call(stub.CreateQueue, pb.CreateQueueRequest(name=args.queue), args.timeout)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            # It exists with another configuration: use it as it is.
            log(f"queue {args.queue} exists with another configuration: {err.details()}")

        batch = [pb.OutMessage(payload=f"{args.prefix}-{i}".encode()) for i in range(args.count)]
        resp = call(stub.Publish, pb.PublishRequest(queue=args.queue, messages=batch), args.timeout)
        print(f"published {len(resp.ids)} messages to {args.queue}", flush=True)

        for m in consume(stub, args.queue, args.count, args.timeout):
            print(f"acked {m.id} {m.payload.decode()} delivery={m.delivery_count} fencing_token={m.fencing_token}", flush=True)

        st = call(stub.Stats, pb.StatsRequest(name=args.queue), args.timeout)
        print(f"stats {st.name}: ready={st.ready} in_flight={st.in_flight} dead={st.dead}", flush=True)
    finally:
        channel.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:7070", help="broker address (host:port)")
    p.add_argument("--queue", default="python-example", help="queue name")
    p.add_argument("--count", type=int, default=10, help="messages to publish and consume (1..1000)")
    p.add_argument("--prefix", default="hello", help="payloads are PREFIX-0, PREFIX-1, ...")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call and for the stream")
    p.add_argument("--tls", action="store_true", help="use TLS, trusting the system's CAs (implied by --tls-ca)")
    p.add_argument("--tls-ca", help="use TLS, trusting these PEM CA certificates")
    p.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS, with --tls-key")
    p.add_argument("--tls-key", help="the client certificate's key (PEM)")
    p.add_argument("--tls-server-name", help="name the broker's certificate must carry; default the host dialled")
    p.add_argument("--token-file", help="file holding a bearer token (or set $QBROKER_TOKEN); needs TLS")
    args = p.parse_args()
    if not 1 <= args.count <= 1000:
        p.error("--count must be 1..1000")
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
