"""The same pymongo workload through a tokenizing proxy and straight to the
upstream, on twin databases: every document, key order included, every
change event and every error text must be the same.

usage: differential.py PROXY_URI DIRECT_URI DB_PREFIX
"""

import sys

import pymongo
from bson import Timestamp
from pymongo import InsertOne, UpdateOne
from pymongo.errors import BulkWriteError, ClientBulkWriteException, OperationFailure

proxy_uri, direct_uri, prefix = sys.argv[1:4]


def normalized(text, side):
    return text.replace(f"{prefix}_{side}", f"{prefix}_SIDE")


def error_of(fn, side):
    try:
        fn()
    except BulkWriteError as e:
        w = e.details["writeErrors"][0]
        return ("write", w["code"], normalized(w["errmsg"], side))
    except OperationFailure as e:
        return ("command", e.code, normalized(str(e.details.get("errmsg")), side))
    return ("ok",)


def event_of(stream):
    e = stream.next()
    for k in ("_id", "clusterTime", "wallTime", "ns", "collectionUUID"):
        e.pop(k, None)
    return e


def workload(client, side):
    db = client[f"{prefix}_{side}"]
    client.drop_database(db.name)
    c = db.players
    out = []
    with client.start_session() as s:
        c.insert_one({"_id": 0, "seedField": 1}, session=s)
        # Started just after that insert: a stream opened without a start point
        # starts at the upstream's visible tail, which a concurrent write
        # elsewhere can hold behind the insert.
        after = Timestamp(s.operation_time.time, s.operation_time.inc + 1)
    stream = c.watch([{"$match": {"operationType": {"$in": ["insert", "update"]}}}], start_at_operation_time=after)
    # An upsert creating several fields at once: the server orders them by name.
    c.update_one(
        {"_id": 1},
        {
            "$set": {"playerDisplayName": "Ann", "preferredPlayingPositions": ["GK"]},
            "$setOnInsert": {"contractInformation": {"clubName": "c"}, "custom": {"Favorite Team": "x"}},
        },
        upsert=True,
    )
    # New top-level and nested fields in one $set.
    c.update_one(
        {"_id": 1},
        {"$set": {"minuteOfTheMatch": 3, "custom.Referee Full Name": "R", "custom.Assistant Name": "S",
                  "contractInformation.annualSalary": 5, "contractInformation.agentName": "A"}},
    )
    c.update_one({"_id": 1}, {"$rename": {"minuteOfTheMatch": "matchMinuteNumber"}})
    c.update_one({"_id": 1}, {"$unset": {"matchMinuteNumber": "", "custom.Referee Full Name": ""}})
    out.append(list(c.find({}, sort=[("_id", 1)])))
    out.append(
        c.find_one_and_update(
            {"_id": 2},
            {"$set": {"zetaLongName": 1, "alphaLongName": 2}, "$setOnInsert": {"middleLongName": 3}},
            upsert=True,
            projection={"alphaLongName": 1, "zetaLongName": 1},
            return_document=pymongo.ReturnDocument.AFTER,
        )
    )
    c.bulk_write(
        [
            UpdateOne({"_id": 3}, {"$set": {"preferredPlayingPositions": [], "custom.Bravo Name": 1,
                                            "custom.Alpha Name": 2}}, upsert=True),
            InsertOne({"_id": 4, "playerDisplayName": "Bob"}),
        ]
    )
    out.append(list(c.find({"_id": {"$gte": 2}}, sort=[("_id", 1)])))
    out.append([event_of(stream) for _ in range(7)])
    # The server's error texts, naming the logical fields.
    c.create_index("playerDisplayName", unique=True, sparse=True)
    out.append(error_of(lambda: c.insert_one({"playerDisplayName": "Ann"}), side))
    out.append(error_of(lambda: c.update_one({"_id": 1}, {"$inc": {"playerDisplayName": 1}}), side))
    out.append(error_of(lambda: c.update_one({"_id": 1}, {"$push": {"contractInformation": 1}}), side))
    out.append(error_of(lambda: c.update_one({"_id": 1}, {"$set": {"playerDisplayName.firstPart": 1}}), side))
    out.append(error_of(lambda: c.update_one({"_id": 1}, {"$set": {"annualBonus.x": 1, "annualBonus": 2}}), side))
    out.append(error_of(lambda: c.update_one({"_id": 1}, {"$rename": {"playerDisplayName": "playerDisplayName.inner"}}), side))
    # A client bulkWrite across two databases.
    other = client[f"{prefix}_{side}_other"]
    client.drop_database(other.name)
    result = client.bulk_write(
        [
            pymongo.InsertOne({"_id": 1, "playerDisplayName": "Cy"}, namespace=f"{db.name}.players2"),
            pymongo.InsertOne({"_id": 1, "matchReference": 9}, namespace=f"{other.name}.games"),
            pymongo.UpdateOne({"_id": 2}, {"$set": {"matchReference": 1, "custom.Venue Name": "v"}},
                              upsert=True, namespace=f"{other.name}.games"),
        ],
        verbose_results=True,
    )
    out.append((result.inserted_count, result.upserted_count, sorted(result.update_results)))
    out.append(list(other.games.find({}, sort=[("_id", 1)])))
    try:
        client.bulk_write([pymongo.InsertOne({"_id": 1}, namespace=f"{other.name}.games")])
        out.append("no error")
    except ClientBulkWriteException as e:
        out.append([(w["code"], normalized(w["errmsg"], side)) for w in e.write_errors])
    return out


def main():
    via = workload(pymongo.MongoClient(proxy_uri), "proxy")
    direct = workload(pymongo.MongoClient(direct_uri), "direct")
    failed = 0
    for i, (a, b) in enumerate(zip(via, direct)):
        # repr keeps key order: dicts compare without it.
        if repr(a) != repr(b):
            failed += 1
            print(f"step {i} differs:\n  proxy:  {a!r}\n  direct: {b!r}")
    if len(via) != len(direct):
        failed += 1
        print("different step counts")
    if failed:
        sys.exit(1)
    print(f"{len(via)} steps identical")


main()
