"""The quick-start workload: Appboy-style user profiles written and read
through Laconic, then measured on the upstream.

usage: demo_workload.py PROXY_URI DIRECT_URI
"""
import random
import sys
import time

import bson
import pymongo

proxy_uri, direct_uri = sys.argv[1], sys.argv[2]
N = 2000
ATTRIBUTES = ["Favorite Player", "Annual Subscriber", "Season Ticket Holder", "Preferred Store Location",
              "Last Purchased Product Category", "Newsletter Frequency Preference", "Loyalty Program Tier",
              "Referral Source Campaign", "Favorite Music Genre", "Push Notification Opt In"]
ARTISTS = ["Taylor Swift", "Kendrick Lamar", "Billie Eilish", "The Weeknd", "Bad Bunny", "Dua Lipa"]

rng = random.Random(7)


def profile(i):
    return {
        "_id": i,
        "first_name": f"First{i}",
        "last_name": f"Last{i}",
        "email_address": f"user{i}@example.com",
        "custom": {name: rng.choice([True, False, rng.randint(0, 1000), f"value {i}"])
                   for name in rng.sample(ATTRIBUTES, 6)},
        "top_artists": rng.sample(ARTISTS, 3),
    }


docs = [profile(i) for i in range(N)]
logical = sum(len(bson.encode(d)) for d in docs)

via = pymongo.MongoClient(proxy_uri)
coll = via.laconic_demo.profiles
coll.drop()
t = time.time()
coll.insert_many(docs)
write_s = time.time() - t
t = time.time()
back = list(coll.find({}).sort("_id", 1))
read_s = time.time() - t
assert back == docs, "documents read through Laconic differ from those written"
player = coll.count_documents({"custom.Favorite Player": {"$exists": True}})

direct = pymongo.MongoClient(direct_uri)
stored = next(direct.laconic_demo.profiles.aggregate(
    [{"$group": {"_id": None, "bytes": {"$sum": {"$bsonSize": "$$ROOT"}}}}]))["bytes"]
sample = direct.laconic_demo.profiles.find_one({"_id": 0})

print(f"wrote {N} profiles through Laconic in {write_s:.2f} s, read them back in {read_s:.2f} s: identical")
print(f"profiles with a 'Favorite Player' custom attribute: {player}")
print(f"logical BSON (what the application sent): {logical:>9,} B  ({logical / N:.0f} B/doc)")
print(f"stored BSON (what the upstream holds):    {stored:>9,} B  ({stored / N:.0f} B/doc)")
print(f"bytes saved: {logical - stored:,} B ({100 * (logical - stored) / logical:.1f}%)")

# The same documents written directly, without Laconic, for the storage engine's view.
plain = direct.laconic_demo.profiles_plain
plain.drop()
plain.insert_many(docs)
try:
    stats = {name: direct.laconic_demo.command("collStats", name)
             for name in ("profiles", "profiles_plain")}
    for field in ("size", "storageSize"):
        a, b = stats["profiles_plain"].get(field), stats["profiles"].get(field)
        if a and b:
            print(f"collStats {field:<11}: {a:>9,} B without Laconic, {b:>9,} B with it ({b / a:.2f}x)")
except pymongo.errors.OperationFailure as e:
    print(f"(collStats unavailable: {e})")
print("a stored document, read directly from the upstream:")
print(" ", sample)
