// The Node.js driver workload recorded into proto/node-crud.lcap.
const { MongoClient } = require("mongodb");

async function main() {
  const client = new MongoClient(process.argv[2]);
  await client.connect();
  const db = client.db("lt_capture_node");
  await db.dropDatabase();
  const c = db.collection("events");
  await c.insertMany(Array.from({ length: 30 }, (_, i) => ({ _id: i, kind: `k${i % 3}`, attributes: { "Annual Subscriber": i % 2 === 0 }, seq: i })));
  await c.updateOne({ _id: 1 }, { $set: { "attributes.Favorite Team": "x" } });
  await c.find({ seq: { $gte: 3 } }).sort({ seq: -1 }).batchSize(5).toArray();
  await c.aggregate([{ $match: { kind: "k1" } }, { $project: { seq: 1, attributes: 1 } }]).toArray();
  await c.findOneAndReplace({ _id: 2 }, { kind: "replaced" }, { returnDocument: "after" });
  await c.countDocuments({ kind: "k0" });
  await c.deleteMany({ seq: { $gt: 25 } });
  await client.close();
}

main().catch((e) => { console.error(e); process.exit(1); });
