"""The pymongo workload recorded into proto/pymongo-crud.lcap."""
import sys

import pymongo

client = pymongo.MongoClient(sys.argv[1])
db = client.lt_capture_pymongo
client.drop_database(db.name)
users = db.users
users.insert_many([{"_id": i, "first_name": f"user {i}", "custom": {"Favorite Player": f"p{i % 5}"}, "n": i}
                   for i in range(40)])
users.update_many({"n": {"$lt": 10}}, {"$set": {"custom.Season Ticket Holder": True}})
list(users.find({"n": {"$gte": 5}}, {"first_name": 1, "custom": 1}).sort("n", 1).batch_size(7))
list(users.aggregate([{"$group": {"_id": "$custom.Favorite Player", "n": {"$sum": 1}}}, {"$sort": {"_id": 1}}]))
users.find_one_and_update({"_id": 3}, {"$inc": {"n": 100}}, return_document=pymongo.ReturnDocument.AFTER)
users.count_documents({"custom.Season Ticket Holder": True})
users.distinct("custom.Favorite Player")
users.delete_many({"n": {"$gt": 30}})
users.create_index([("first_name", 1)])
list(users.list_indexes())
client.close()
