"""pymongo reads batches that expansion cuts, through a tokenizing Laconic.

usage: pymongo_held.py URI DATABASE

Documents of 1,000 names of 1,000 bytes (1 MB each, about 10 KB stored):
a server batch of them expands past the reply limit and is cut, the rest
held. pymongo reads them whole with a cut first batch and with a cut
getMore batch (taking the cursor id from each reply), and a change stream
that pymongo resumes from the token it cached at the end of a cut part
reads the rest of the batch, none missed.
"""
import sys

import pymongo

uri, name = sys.argv[1], sys.argv[2]
client = pymongo.MongoClient(uri)
db = client[name]
db.drop_collection("c")
db.create_collection("c")
c = db.c
NAMES = ["%04d%s" % (i, "n" * 996) for i in range(1000)]


def wide(d):
    doc = {"_id": d}
    for n in NAMES:
        doc[n] = d
    return doc


# Only the inserts: a stream opened without a start point may begin before
# the collection was made.
INSERTS = [{"$match": {"operationType": "insert"}}]
stream = c.watch(INSERTS)
for start in range(0, 40, 20):
    c.insert_many([wide(d) for d in range(start, start + 20)])

# Cut in the first batch, then in a getMore's batch.
assert list(c.find({}, sort=[("_id", 1)], batch_size=30)) == [wide(d) for d in range(40)]
read = list(c.aggregate([{"$sort": {"_id": 1}}], batchSize=0))
assert read == [wide(d) for d in range(40)], "aggregate"

# The change stream: read up to the end of the first part (the driver's
# buffer empty), where pymongo caches that part's postBatchResumeToken.
seen = []
token = None
while len(seen) < 40:
    event = stream.next()
    assert event["fullDocument"] == wide(event["documentKey"]["_id"])
    seen.append(event["documentKey"]["_id"])
    if not stream._cursor._data:
        token = stream.resume_token
        break
assert 0 < len(seen) < 40, "the first part was cut: %d events" % len(seen)
stream.close()
resumed = c.watch(INSERTS, resume_after=token, max_await_time_ms=500)
while len(seen) < 40:
    event = resumed.try_next()
    if event is None:
        break
    seen.append(event["documentKey"]["_id"])
assert seen == list(range(40)), "resumed after the first part: %s" % seen
print("all checks passed")
