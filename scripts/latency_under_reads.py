"""Another client's ping latency while clients read large batches.

    .upstream/venv/bin/python scripts/latency_under_reads.py URI [READERS] [SECONDS] [DB]

READERS processes (2 by default) each read, over and over, 20,000
documents of 60 fields with long names (about 10 MB stored once tokenized,
36 MB once expanded: 16 MiB batches, cut and held back by the proxy), while
this process sends `ping` every 2 ms for SECONDS (10 by default) and prints
the pings' p50, p99 and maximum, and how many times the readers read the
collection. Point URI at a tokenizing Laconic, at a pass-through one, or at
the upstream itself; the documents are written through URI into DB.names
(`rb` by default) if they are not there yet. How the README's figures on
replies rewritten off the runtime's threads were measured.
"""

import multiprocessing as mp
import sys
import time

import pymongo

DOCS = 20_000


def reader(uri, db, stop, passes):
    coll = pymongo.MongoClient(uri)[db].names
    n = 0
    while not stop.is_set():
        for _ in coll.find().batch_size(DOCS):
            pass
        n += 1
    with passes.get_lock():
        passes.value += n


def main():
    uri = sys.argv[1]
    readers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    db = sys.argv[4] if len(sys.argv) > 4 else "rb"
    client = pymongo.MongoClient(uri)
    coll = client[db].names
    if coll.estimated_document_count() != DOCS:
        coll.drop()
        for start in range(0, DOCS, 2000):
            coll.insert_many(
                [
                    {"_id": i, **{"customAttributeNumber_%02d" % k: k for k in range(60)}}
                    for i in range(start, start + 2000)
                ]
            )
    client.admin.command("ping")
    stop, passes = mp.Event(), mp.Value("i", 0)
    procs = [mp.Process(target=reader, args=(uri, db, stop, passes)) for _ in range(readers)]
    for p in procs:
        p.start()
    time.sleep(1)
    latencies = []
    end = time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        client.admin.command("ping")
        latencies.append(time.perf_counter() - t)
        time.sleep(0.002)
    stop.set()
    for p in procs:
        p.join()
    latencies.sort()

    def q(f):
        return latencies[min(len(latencies) - 1, int(f * len(latencies)))] * 1000

    print(
        f"readers={readers} passes={passes.value} pings={len(latencies)} "
        f"p50={q(0.5):.2f}ms p99={q(0.99):.2f}ms max={latencies[-1] * 1000:.1f}ms"
    )


if __name__ == "__main__":
    main()
