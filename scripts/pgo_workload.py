"""The training workload of a profile-guided build (scripts/build-pgo.sh):
what the benchmark measures, through one proxy, with pymongo.

usage: pgo_workload.py PROXY_URI
"""
import sys

import pymongo
from bson import ObjectId

client = pymongo.MongoClient(sys.argv[1], directConnection=True)
db = client.laconic_pgo
db.drop_collection("items")
db.drop_collection("many")
items = db.items
items.insert_many([{"_id": i, "name": f"user-{i}", "email": f"user{i}@example.com",
                    "score": i * 7, "tags": ["a", "b", "c"]} for i in range(1000)])
items.create_index([("score", pymongo.ASCENDING)])
for i in range(2000):
    items.insert_one({"_id": ObjectId(), "n": i, "name": "x" * 40})
    assert items.find_one({"_id": i % 1000})
    items.update_one({"_id": i % 1000}, {"$inc": {"score": 1}, "$set": {"tags.1": "z"}})
for i in range(300):
    assert len(list(items.find({"_id": {"$lt": 1000}}))) == 1000
    db.many.insert_many([{"_id": ObjectId(), "n": i * 100 + k} for k in range(100)])
    list(items.aggregate([{"$match": {"score": {"$gte": i}}}, {"$group": {"_id": None, "n": {"$sum": 1}}}]))
db.drop_collection("items")
db.drop_collection("many")
