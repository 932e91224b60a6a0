#!/usr/bin/python3
"""Lock+unlock latency and handoffs per second of kazoo's Lock recipe,
measured the way lock/bench_test.go measures qbroker's lock.Mutex (which
runs this script in BenchmarkKazoo against the same ZooKeeper server).

usage: kazoo_lock.py HOST:PORT uncontended|handoff N [CONTENDERS]

uncontended: one client locks and unlocks N times.
handoff: CONTENDERS clients (one session each, one thread each) lock and
unlock N times in total.
Prints "seconds=<elapsed>" for the N operations (client start-up and the
lock node's creation excluded).
"""
import sys
import threading
import time
import uuid

from kazoo.client import KazooClient


def start(hosts):
    c = KazooClient(hosts=hosts, timeout=10.0)
    c.start(timeout=30)
    return c


def run(hosts, mode, n, contenders):
    path = "/kazoo-bench/" + uuid.uuid4().hex
    clients = [start(hosts) for _ in range(contenders)]
    locks = [c.Lock(path, "c%d" % i) for i, c in enumerate(clients)]
    locks[0].acquire()  # creates the lock's node
    locks[0].release()
    left = [n]
    mu = threading.Lock()

    def contend(lk):
        while True:
            with mu:
                if left[0] <= 0:
                    return
                left[0] -= 1
            lk.acquire()
            lk.release()

    threads = [threading.Thread(target=contend, args=(lk,)) for lk in locks]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    clients[0].delete(path, recursive=True)
    for c in clients:
        c.stop()
        c.close()
    return elapsed


def main():
    hosts, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "uncontended":
        contenders = 1
    elif mode == "handoff":
        contenders = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    else:
        sys.exit("mode must be uncontended or handoff")
    print("seconds=%f" % run(hosts, mode, n, contenders))


if __name__ == "__main__":
    main()
