"""One of the benchmark's operations, again and again, through a proxy that
callgrind counts (scripts/instructions.sh): a warm-up, then `ready` on
stdout; on a line from stdin, N operations, then `done`; on another line,
the end.

usage: instructions_workload.py PROXY_URI OPERATION N DATABASE
"""
import sys

import pymongo
from bson import ObjectId

uri, op, n, database = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = pymongo.MongoClient(uri, directConnection=True)
db = client[database]
items = db.items
if items.count_documents({}) != 1000:
    items.drop()
    items.insert_many([{"_id": i, "name": f"user-{i}", "email": f"user{i}@example.com",
                        "score": i * 7, "tags": ["a", "b", "c"]} for i in range(1000)])


def run(count):
    for i in range(count):
        if op == "cursor":
            assert len(list(items.find({"_id": {"$lt": 1000}}))) == 1000
        elif op == "find_one":
            assert items.find_one({"_id": i % 1000})
        elif op == "insert_one":
            db.ones.insert_one({"_id": ObjectId(), "n": i, "name": "x" * 40})
        elif op == "update_one":
            assert items.update_one({"_id": i % 1000}, {"$inc": {"score": 1}}).matched_count == 1
        elif op == "insert_many":
            db.many.insert_many([{"_id": ObjectId(), "n": i * 100 + k} for k in range(100)])
        else:
            sys.exit(f"unknown operation {op}")


run(20)
print("ready", flush=True)
sys.stdin.readline()
run(n)
print("done", flush=True)
sys.stdin.readline()
