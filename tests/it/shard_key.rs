//! Shard keys rewritten with Locality UUIDs: applications keep their
//! ObjectIds; the upstream stores keys that spread writes.

use bson::{doc, oid::ObjectId, spec::BinarySubtype, Bson, Document};
use futures::TryStreamExt;
use laconic::config::ShardKeyConfig;
use laconic::locality::{self, Fields, Mode};
use mongodb::{Client, Collection};

use crate::common::{self, db_name};

async fn proxy_with(spec: &str) -> laconic::downstream::ProxyHandle {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.shard_keys = vec![ShardKeyConfig::parse_flag(spec).unwrap()];
    common::start(config).await
}

/// Inserts documents with driver-generated ObjectIds; returns them as the driver knows them.
async fn seed(c: &Collection<Document>) -> Vec<Document> {
    c.drop().await.unwrap();
    let docs: Vec<Document> = (0..30)
        .map(|i| doc! {"_id": ObjectId::new(), "n": i})
        .collect();
    c.insert_many(docs.clone()).await.unwrap();
    docs
}

fn oid(d: &Document) -> ObjectId {
    d.get_object_id("_id").unwrap()
}

async fn all(c: &Collection<Document>, filter: Document) -> Vec<Document> {
    c.find(filter)
        .sort(doc! {"n": 1})
        .batch_size(4)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Find, update and delete by ObjectId, and `$in`, all through the proxy.
async fn crud_by_object_id(c: &Collection<Document>, docs: &[Document]) {
    assert_eq!(
        all(c, doc! {}).await,
        docs,
        "reads return the ObjectIds over several getMores"
    );
    let one = c.find_one(doc! {"_id": oid(&docs[3])}).await.unwrap();
    assert_eq!(one.as_ref(), Some(&docs[3]));
    let some = all(
        c,
        doc! {"_id": {"$in": [oid(&docs[1]), oid(&docs[7]), ObjectId::new()]}},
    )
    .await;
    assert_eq!(some, vec![docs[1].clone(), docs[7].clone()]);
    let others = c
        .count_documents(doc! {"_id": {"$nin": [oid(&docs[0])]}})
        .await
        .unwrap();
    assert_eq!(others, 29);
    let r = c
        .update_one(
            doc! {"_id": oid(&docs[5])},
            doc! {"$set": {"touched": true}},
        )
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);
    let after = c
        .find_one(doc! {"_id": oid(&docs[5])})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, doc! {"_id": oid(&docs[5]), "n": 5, "touched": true});
    let r = c.delete_one(doc! {"_id": oid(&docs[6])}).await.unwrap();
    assert_eq!(r.deleted_count, 1);
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 29);
    let v = c
        .find_one_and_update(doc! {"_id": oid(&docs[8])}, doc! {"$inc": {"n": 100}})
        .return_document(mongodb::options::ReturnDocument::After)
        .await
        .unwrap();
    assert_eq!(v, Some(doc! {"_id": oid(&docs[8]), "n": 108}));
}

#[tokio::test]
async fn replace_strategy_stores_locality_uuids_and_stays_transparent() {
    let proxy = proxy_with(&format!("{}.users:_id:replace", db_name("sk", "replace"))).await;
    let client = common::via_proxy(&proxy).await;
    let c: Collection<Document> = client
        .database(&db_name("sk", "replace"))
        .collection("users");
    let docs = seed(&c).await;
    crud_by_object_id(&c, &docs).await;

    // What the upstream holds: Locality UUIDs that decode to each ObjectId's time.
    let raw: Vec<Document> = common::stored(&db_name("sk", "replace"), "users").await;
    assert_eq!(raw.len(), 29);
    for d in &raw {
        let Some(Bson::Binary(b)) = d.get("_id") else {
            panic!("stored _id is not binary: {d}")
        };
        assert_eq!(
            b.subtype,
            BinarySubtype::UserDefined(laconic::rewrite::shard_key::SUBTYPE)
        );
        let bytes: [u8; 16] = b.bytes.clone().try_into().unwrap();
        let fields = Fields::decode(&bytes, Mode::Default).expect("a Locality UUID (version b)");
        let original = ObjectId::from_bytes(locality::to_object_id(&bytes).unwrap());
        assert_eq!(
            fields.millis,
            original.timestamp().timestamp_millis() as u64
        );
        assert!(docs.iter().any(|x| oid(x) == original));
    }

    // Sort and range on the rewritten key are refused, naming the collection and field.
    let ns = format!("{}.users._id", db_name("sk", "replace"));
    let sorted = c
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .expect_err("sort refused");
    let ranged = c
        .find(doc! {"_id": {"$gt": oid(&docs[0])}})
        .await
        .expect_err("range refused");
    for err in [sorted, ranged] {
        let e = common::command_error(err);
        assert_eq!((e.code, e.code_name.as_str()), (115, "CommandNotSupported"));
        assert!(e.message.contains(&ns), "{}", e.message);
    }
    // The connection stays usable after a refusal.
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 29);
}

#[tokio::test]
async fn replace_in_sequential_mode_clusters_keys_of_a_window() {
    let proxy = proxy_with(&format!(
        "{}.events:_id:replace:sequential",
        db_name("sk", "seq")
    ))
    .await;
    let client = common::via_proxy(&proxy).await;
    let c: Collection<Document> = client.database(&db_name("sk", "seq")).collection("events");
    let docs = seed(&c).await;
    assert_eq!(all(&c, doc! {}).await, docs);
    let raw: Vec<Document> = common::stored(&db_name("sk", "seq"), "events").await;
    let prefixes: std::collections::HashSet<Vec<u8>> = raw
        .iter()
        .map(|d| match d.get("_id") {
            Some(Bson::Binary(b)) => b.bytes[..2].to_vec(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        prefixes.len() <= 2,
        "ids of one window share a prefix: {prefixes:?}"
    );
}

#[tokio::test]
async fn derive_strategy_adds_a_hidden_key_and_keeps_sort_and_range() {
    let db = db_name("sk", "derive");
    let proxy = proxy_with(&format!("{db}.users:_id:derive")).await;
    let client = common::via_proxy(&proxy).await;
    let c: Collection<Document> = client.database(&db).collection("users");
    let docs = seed(&c).await;
    crud_by_object_id(&c, &docs).await;

    // Sort and range on _id work and match the same query on an untouched twin.
    let twin: Collection<Document> = common::direct()
        .await
        .database(&db_name("sk", "derive_twin"))
        .collection("users");
    twin.drop().await.unwrap();
    twin.insert_many(docs.clone()).await.unwrap();
    twin.update_one(
        doc! {"_id": oid(&docs[5])},
        doc! {"$set": {"touched": true}},
    )
    .await
    .unwrap();
    twin.delete_one(doc! {"_id": oid(&docs[6])}).await.unwrap();
    twin.update_one(doc! {"_id": oid(&docs[8])}, doc! {"$inc": {"n": 100}})
        .await
        .unwrap();
    let q = doc! {"_id": {"$gte": oid(&docs[10])}};
    let via: Vec<Document> = c
        .find(q.clone())
        .sort(doc! {"_id": -1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let expected: Vec<Document> = twin
        .find(q)
        .sort(doc! {"_id": -1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(via, expected);
    assert_eq!(via.len(), 20);

    // The upstream holds the derived key; a projection that names it shows it.
    let raw = common::direct()
        .await
        .database(&db)
        .collection::<Document>("users")
        .find_one(doc! {"_id": oid(&docs[2])})
        .await
        .unwrap()
        .unwrap();
    let Some(Bson::Binary(b)) = raw.get("_lk") else {
        panic!("{raw}")
    };
    assert_eq!(b.subtype, BinarySubtype::Uuid);
    let bytes: [u8; 16] = b.bytes.clone().try_into().unwrap();
    assert_eq!(locality::to_object_id(&bytes), Some(oid(&docs[2]).bytes()));
    let shown = c
        .find_one(doc! {"_id": oid(&docs[2])})
        .projection(doc! {"_lk": 1})
        .await
        .unwrap()
        .unwrap();
    assert!(shown.contains_key("_lk"));

    // An upsert pinned by _id gets the derived key too.
    let new_id = ObjectId::new();
    c.update_one(doc! {"_id": new_id}, doc! {"$set": {"n": 999}})
        .upsert(true)
        .await
        .unwrap();
    let upserted = common::direct()
        .await
        .database(&db)
        .collection::<Document>("users")
        .find_one(doc! {"_id": new_id})
        .await
        .unwrap()
        .unwrap();
    assert!(upserted.contains_key("_lk"), "{upserted}");
    assert_eq!(
        c.find_one(doc! {"_id": new_id}).await.unwrap(),
        Some(doc! {"_id": new_id, "n": 999})
    );
}

#[tokio::test]
async fn bulk_write_ops_follow_their_namespace_rule() {
    use mongodb::options::{InsertOneModel, WriteModel};
    let db = db_name("sk", "bulk");
    let proxy = proxy_with(&format!("{db}.keyed:_id:replace")).await;
    let client: Client = common::via_proxy(&proxy).await;
    let keyed: Collection<Document> = client.database(&db).collection("keyed");
    let plain: Collection<Document> = client.database(&db).collection("plain");
    keyed.drop().await.unwrap();
    plain.drop().await.unwrap();
    let (a, b) = (ObjectId::new(), ObjectId::new());
    client
        .bulk_write(vec![
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(keyed.namespace())
                    .document(doc! {"_id": a})
                    .build(),
            ),
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(plain.namespace())
                    .document(doc! {"_id": b})
                    .build(),
            ),
        ])
        .await
        .unwrap();
    let direct = common::direct().await;
    let k = direct
        .database(&db)
        .collection::<Document>("keyed")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    let p = direct
        .database(&db)
        .collection::<Document>("plain")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(k.get("_id"), Some(Bson::Binary(_))), "{k}");
    assert_eq!(p, doc! {"_id": b});
    assert_eq!(
        keyed.find_one(doc! {"_id": a}).await.unwrap(),
        Some(doc! {"_id": a})
    );
}

#[tokio::test]
async fn a_refused_unacknowledged_write_gets_no_reply_and_the_connection_goes_on() {
    use laconic::wire::MsgFlags;

    use crate::common::{body, op_msg, raw_session, read_frame, write_frame};

    let db = db_name("sk", "w0");
    let proxy = proxy_with(&format!("{db}.c:_id:replace")).await;
    let mut s = raw_session(&proxy).await;
    // A w:0 delete with a range on the rewritten key cannot be forwarded, and
    // must not be answered either.
    let refused = op_msg(
        20,
        MsgFlags::MORE_TO_COME,
        doc! {"delete": "c", "deletes": [{"q": {"_id": {"$gt": ObjectId::new()}}, "limit": 0}], "writeConcern": {"w": 0}, "$db": &db},
    );
    write_frame(&mut s, &refused).await;
    write_frame(&mut s, &op_msg(21, 0, doc! {"ping": 1, "$db": "admin"})).await;
    let reply = read_frame(&mut s).await.unwrap();
    assert_eq!(
        reply.header.response_to, 21,
        "the next reply answers the ping"
    );
    assert_eq!(body(&reply).get_f64("ok").unwrap(), 1.0);
}
