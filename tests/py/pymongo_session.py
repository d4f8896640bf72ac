"""pymongo through Laconic, given only the proxy's address (no directConnection).

usage: pymongo_session.py URI PROXY_HOST:PORT UPSTREAM_HOST:PORT

Runs CRUD, a cursor over several getMores, an aggregation, a transaction and a
change stream, and checks that pymongo never opened a connection to any
address but the proxy's (in particular not the upstream's).
"""
import sys
import threading

import pymongo
from bson import Timestamp
from pymongo import monitoring

uri, proxy, upstream = sys.argv[1], sys.argv[2], sys.argv[3]
seen = set()


class Servers(monitoring.ServerListener):
    def opened(self, event):
        seen.add("%s:%d" % event.server_address)

    def description_changed(self, event):
        seen.add("%s:%d" % event.server_address)

    def closed(self, event):
        pass


class Pool(monitoring.ConnectionPoolListener):
    def connection_created(self, event):
        seen.add("%s:%d" % event.address)

    def __getattr__(self, name):
        return lambda event: None


client = pymongo.MongoClient(uri, event_listeners=[Servers(), Pool()])
db = client.lt_pymongo
db.drop_collection("people")
people = db.people

# CRUD
people.insert_one({"_id": 1, "first_name": "Jon", "custom": {"Favorite Player": "LeBron"}})
people.insert_many([{"_id": i, "n": i, "even": i % 2 == 0} for i in range(2, 302)])
assert people.find_one({"_id": 1}) == {"_id": 1, "first_name": "Jon", "custom": {"Favorite Player": "LeBron"}}
people.update_one({"_id": 1}, {"$set": {"custom.Season Ticket Holder": True}})
assert people.find_one({"_id": 1})["custom"] == {"Favorite Player": "LeBron", "Season Ticket Holder": True}
assert people.delete_many({"even": False}).deleted_count == 150
assert people.count_documents({}) == 151

# Unacknowledged writes (w:0: OP_MSG with moreToCome, no reply)
from pymongo.write_concern import WriteConcern
fire = db.get_collection("people", write_concern=WriteConcern(w=0))
for i in range(1000, 1020):
    fire.insert_one({"_id": i, "w0": True})
for _ in range(100):
    if people.count_documents({"w0": True}) == 20:
        break
    import time; time.sleep(0.05)
assert people.count_documents({"w0": True}) == 20
people.delete_many({"w0": True})

# A cursor over many getMores
ids = [d["_id"] for d in people.find({}, batch_size=10).sort("_id", 1)]
assert ids == [1] + list(range(2, 302, 2)), ids[:5]

# An exhaust cursor: one getMore, then a stream of replies with moreToCome
from pymongo import CursorType
streamed = [d["_id"] for d in people.find({}, cursor_type=CursorType.EXHAUST, batch_size=10).sort("_id", 1)]
assert streamed == ids, streamed[:5]

# Aggregation
groups = list(people.aggregate([{"$group": {"_id": "$even", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]))
assert groups == [{"_id": None, "n": 1}, {"_id": True, "n": 150}], groups

# A transaction, committed
with client.start_session() as s:
    with s.start_transaction():
        people.insert_one({"_id": "tx1"}, session=s)
        people.update_one({"_id": 1}, {"$set": {"in_tx": True}}, session=s)
    # A change stream opened without a start point starts at the upstream's
    # visible tail, which a concurrent write elsewhere can hold behind the
    # transaction: the one below starts just after it.
    after_tx = Timestamp(s.operation_time.time, s.operation_time.inc + 1)
assert people.find_one({"_id": "tx1"}) == {"_id": "tx1"}
assert people.find_one({"_id": 1})["in_tx"] is True

# A change stream
events = []
with people.watch(start_at_operation_time=after_tx) as stream:
    def write():
        people.insert_one({"_id": "cs", "custom": {"Favorite Player": "x"}})
        people.update_one({"_id": "cs"}, {"$set": {"custom.Favorite Player": "y"}})
    t = threading.Thread(target=write)
    t.start()
    for change in stream:
        events.append(change)
        if len(events) == 2:
            break
    t.join()
assert events[0]["operationType"] == "insert", events[0]
assert events[0]["fullDocument"] == {"_id": "cs", "custom": {"Favorite Player": "x"}}
assert events[1]["updateDescription"]["updatedFields"] == {"custom.Favorite Player": "y"}

topology = client.topology_description.topology_type_name
client.close()

assert seen, "no server seen"
assert seen == {proxy}, "pymongo contacted %s (upstream is %s)" % (sorted(seen), upstream)
assert upstream not in seen
print("topology:", topology)
print("all checks passed")
