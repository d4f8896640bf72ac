//! Aggregation through the token mapping: a corpus of pipelines, each run
//! through Laconic on tokenized collections and directly on untokenized
//! twins, must give the same documents in the same key order (or the same
//! error); constructs that cannot be rewritten are refused by name.

use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::Database;

use crate::common::{self, db_name};

/// Field names of four bytes or more are tokenized, and so is everything
/// under `custom`: almost every name in the corpus is stored as a token.
async fn tokenizing_proxy(test: &str) -> laconic::downstream::ProxyHandle {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.store_db = db_name(test, "store");
    common::start(config).await
}

fn date(s: &str) -> DateTime {
    DateTime::parse_rfc3339_str(s).unwrap()
}

fn customers() -> Vec<Document> {
    let c = |id: &str,
             region: &str,
             first: &str,
             last: &str,
             portfolio: &[&str],
             score: i32,
             tier: i32,
             city: &str,
             lon: f64| {
        doc! {
            "_id": id, "region": region, "firstname": first, "lastname": last,
            "portfolio": portfolio.to_vec(),
            "score": score,
            "joined": date(&format!("2023-0{}-1{}T00:00:00Z", 1 + score % 9, score % 10)),
            "custom": {"Favorite Player": format!("player {score}"), "Loyalty Tier": tier, "vip": score > 8},
            "count": score % 4,
            "address": {"city": city, "postcode": format!("{}", 89000 + score), "location": {"type": "Point", "coordinates": [lon, 39.5]}},
            "orders": [
                {"item": "book", "quantity": 1 + score % 3, "price": 12.5},
                {"item": if score % 2 == 0 { "music" } else { "film" }, "quantity": 2, "price": 9.0 + f64::from(score)},
            ],
            "reports_to": if score > 10 { Bson::String("Jack".into()) } else { Bson::Null },
        }
    };
    vec![
        c(
            "US4246774937",
            "WEST",
            "Jack",
            "Bateman",
            &["NMAI", "CALA", "MNA"],
            3,
            1,
            "Reno",
            -119.8,
        ),
        c(
            "US1111111111",
            "WEST",
            "Ada",
            "Lovelace",
            &["CALA", "MDB"],
            12,
            2,
            "Sparks",
            -119.7,
        ),
        c(
            "US2222222222",
            "EAST",
            "Grace",
            "Hopper",
            &["MDB"],
            7,
            2,
            "Boston",
            -71.0,
        ),
        c(
            "US3333333333",
            "CENTRAL",
            "Alan",
            "Turing",
            &["NMAI", "MDB"],
            15,
            3,
            "Omaha",
            -95.9,
        ),
        c(
            "US4444444444",
            "EAST",
            "Edsger",
            "Dijkstra",
            &["MNA"],
            9,
            1,
            "Albany",
            -73.7,
        ),
    ]
}

fn stock_data() -> Vec<Document> {
    let mut out = Vec::new();
    let mut n = 0;
    for symbol in ["NMAI", "CALA", "MNA", "MDB"] {
        for minute in 0..3 {
            n += 1;
            let start = date(&format!("2022-11-07T10:0{minute}:00Z"));
            let end = date(&format!("2022-11-07T10:0{}:00Z", minute + 1));
            out.push(doc! {
                "_id": n, "symbol": symbol, "volume": 1000 * n, "opening": 1.0 + f64::from(n),
                "high": 2.0 + f64::from(n), "low": 0.5 + f64::from(n), "closing": 1.5 + f64::from(n),
                "start": start, "end": end,
            });
        }
    }
    out
}

/// Seed 004's single-collection form: daily stock documents and customer
/// documents in one collection.
fn stock_activity() -> Vec<Document> {
    let day = date("2023-02-07T00:00:00Z");
    let mut out = Vec::new();
    for (i, symbol) in ["NMAI", "CALA", "MDB"].iter().enumerate() {
        let i = i as f64;
        out.push(doc! {
            "_id": {"symbol": symbol, "time": day, "type": "day"},
            "closing": 10.0 + i, "high": 11.0 + i, "low": 9.0 + i, "opening": 9.5 + i,
            "regions": [{"region": "WEST"}, {"region": "EAST"}],
            "volume": 1000 + i as i64,
        });
    }
    for (customer, symbols) in [("US1", vec!["NMAI", "CALA"]), ("US2", vec!["MDB"])] {
        for symbol in &symbols {
            out.push(doc! {
                "_id": {"customerID": customer, "symbol": symbol, "type": "customer"},
                "firstname": format!("first {customer}"), "lastname": format!("last {customer}"),
                "portfolio": symbols.clone(),
                "regions": [{"region": "WEST"}],
            });
        }
    }
    out
}

fn employees() -> Vec<Document> {
    [
        ("Dev", "Eliot"),
        ("Eliot", "Ron"),
        ("Ron", "Andrew"),
        ("Andrew", ""),
        ("Asya", "Ron"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (name, boss))| {
        let mut d = doc! {"_id": i as i32, "employee_name": name};
        if !boss.is_empty() {
            d.insert("reports_to", boss);
        }
        d
    })
    .collect()
}

async fn load(db: &Database) {
    db.drop().await.unwrap();
    for (coll, docs) in [
        ("customers", customers()),
        ("stockData", stock_data()),
        ("stockActivity", stock_activity()),
        ("employees", employees()),
    ] {
        db.collection::<Document>(coll)
            .insert_many(docs)
            .await
            .unwrap();
    }
}

/// The documents an aggregate returns, or its error's code and message.
async fn aggregate(
    db: &Database,
    coll: &str,
    pipeline: &[Document],
) -> Result<Vec<Document>, (i32, String)> {
    let cursor = if coll.is_empty() {
        db.aggregate(pipeline.to_vec()).await
    } else {
        db.collection::<Document>(coll)
            .aggregate(pipeline.to_vec())
            .await
    };
    let result = match cursor {
        Ok(c) => c.try_collect().await,
        Err(e) => Err(e),
    };
    result.map_err(|e| match *e.kind {
        mongodb::error::ErrorKind::Command(c) => (c.code, c.message),
        other => (-1, other.to_string()),
    })
}

/// Arrays whose order the server does not define (`$addToSet`) are
/// compared as sets: sorted by their canonical text.
fn unordered(v: &Bson) -> Bson {
    match v {
        Bson::Document(d) => {
            Bson::Document(d.iter().map(|(k, v)| (k.clone(), unordered(v))).collect())
        }
        Bson::Array(a) => {
            let mut items: Vec<Bson> = a.iter().map(unordered).collect();
            items.sort_by_key(|x| x.to_string());
            Bson::Array(items)
        }
        other => other.clone(),
    }
}

struct Case {
    name: &'static str,
    coll: &'static str,
    pipeline: Vec<Document>,
    sets: bool,
}

fn case(name: &'static str, coll: &'static str, pipeline: Vec<Document>) -> Case {
    Case {
        name,
        coll,
        pipeline,
        sets: false,
    }
}

fn corpus() -> Vec<Case> {
    let by_id = doc! {"$sort": {"_id": 1}};
    let day_start = date("2022-11-07T00:00:00Z");
    let day_end = date("2022-11-08T00:00:00Z");
    let seed_lookup_stages = vec![
        doc! {"$match": {"$expr": {"$and": [
            {"$eq": ["$symbol", "$$symbol"]},
            {"$gte": ["$start", "$$start"]},
            {"$lt": ["$end", "$$end"]},
        ]}}},
        doc! {"$group": {
            "_id": "$symbol",
            "opening": {"$first": "$opening"}, "high": {"$max": "$high"},
            "low": {"$min": "$low"}, "closing": {"$last": "$closing"}, "volume": {"$sum": "$volume"},
        }},
        doc! {"$set": {"symbol": "$_id", "_id": "$$REMOVE"}},
    ];
    vec![
        case(
            "match",
            "customers",
            vec![doc! {"$match": {"region": "WEST"}}, by_id.clone()],
        ),
        case(
            "match $expr",
            "customers",
            vec![
                doc! {"$match": {"$expr": {"$gt": ["$score", 8]}}},
                by_id.clone(),
            ],
        ),
        case(
            "match $expr $in",
            "customers",
            vec![
                doc! {"$match": {"$expr": {"$in": ["CALA", "$portfolio"]}}},
                by_id.clone(),
            ],
        ),
        case(
            "project inclusion",
            "customers",
            vec![
                doc! {"$project": {"firstname": 1, "lastname": 1}},
                by_id.clone(),
            ],
        ),
        case(
            "project computed",
            "customers",
            vec![
                doc! {"$project": {"_id": 0, "full_name": {"$concat": ["$firstname", " ", "$lastname"]}}},
                doc! {"$sort": {"full_name": 1}},
            ],
        ),
        case(
            "project dotted",
            "customers",
            vec![
                doc! {"$project": {"address.city": 1, "custom.Loyalty Tier": 1}},
                by_id.clone(),
            ],
        ),
        case(
            "project nested",
            "customers",
            vec![
                doc! {"$project": {"address": {"city": 1, "postcode": 1}}},
                by_id.clone(),
            ],
        ),
        case(
            "project exclusion",
            "customers",
            vec![
                doc! {"$project": {"portfolio": 0, "orders": 0, "address.location": 0}},
                by_id.clone(),
            ],
        ),
        case(
            "addFields",
            "customers",
            vec![
                doc! {"$addFields": {"order_count": {"$size": "$orders"}, "custom.Badge Level": "$score"}},
                by_id.clone(),
            ],
        ),
        case(
            "set dotted",
            "customers",
            vec![doc! {"$set": {"address.country": "US"}}, by_id.clone()],
        ),
        case(
            "unset list",
            "customers",
            vec![
                doc! {"$unset": ["custom", "address.location", "orders"]},
                by_id.clone(),
            ],
        ),
        case(
            "unset one",
            "customers",
            vec![doc! {"$unset": "orders"}, by_id.clone()],
        ),
        case(
            "group",
            "customers",
            vec![
                doc! {"$group": {"_id": "$region", "customer_count": {"$sum": 1}, "total_score": {"$sum": "$score"}}},
                by_id.clone(),
            ],
        ),
        case(
            "group compound id",
            "customers",
            vec![
                doc! {"$sort": {"_id": 1}},
                doc! {"$group": {"_id": {"region": "$region", "tier": "$custom.Loyalty Tier"}, "names": {"$push": "$firstname"}}},
                doc! {"$sort": {"_id.region": 1, "_id.tier": 1}},
            ],
        ),
        case(
            "group null",
            "customers",
            vec![
                doc! {"$group": {"_id": null, "avg_score": {"$avg": "$score"}, "last_joined": {"$max": "$joined"}}},
            ],
        ),
        case(
            "group then match output",
            "customers",
            vec![
                doc! {"$group": {"_id": "$region", "total_score": {"$sum": "$score"}}},
                doc! {"$match": {"total_score": {"$gt": 10}}},
                doc! {"$sort": {"total_score": -1}},
            ],
        ),
        case(
            "unwind then group",
            "customers",
            vec![
                doc! {"$unwind": "$orders"},
                doc! {"$group": {"_id": "$orders.item", "quantity_total": {"$sum": "$orders.quantity"}}},
                by_id.clone(),
            ],
        ),
        case(
            "unwind with index",
            "customers",
            vec![
                doc! {"$unwind": {"path": "$portfolio", "includeArrayIndex": "position"}},
                doc! {"$project": {"portfolio": 1, "position": 1}},
                doc! {"$sort": {"_id": 1, "position": 1}},
            ],
        ),
        case(
            "sortByCount",
            "customers",
            vec![
                doc! {"$sortByCount": "$region"},
                doc! {"$sort": {"count": -1, "_id": 1}},
            ],
        ),
        case(
            "count",
            "customers",
            vec![
                doc! {"$match": {"score": {"$gte": 7}}},
                doc! {"$count": "matching_customers"},
            ],
        ),
        case(
            "bucket",
            "customers",
            vec![doc! {"$bucket": {
                "groupBy": "$score", "boundaries": [0, 5, 10, 20], "default": "other",
                "output": {"customer_total": {"$sum": 1}, "surnames": {"$push": "$lastname"}},
            }}],
        ),
        case(
            "bucketAuto",
            "customers",
            vec![
                doc! {"$bucketAuto": {"groupBy": "$score", "buckets": 2, "output": {"number_of_customers": {"$sum": 1}}}},
            ],
        ),
        case(
            "facet",
            "customers",
            vec![doc! {"$facet": {
                "by_region": [{"$sortByCount": "$region"}, {"$sort": {"count": -1, "_id": 1}}],
                "top_scores": [{"$sort": {"score": -1}}, {"$limit": 2}, {"$project": {"lastname": 1}}],
            }}],
        ),
        case(
            "replaceRoot",
            "customers",
            vec![
                doc! {"$replaceRoot": {"newRoot": "$address"}},
                doc! {"$sort": {"city": 1}},
            ],
        ),
        case(
            "replaceWith mergeObjects",
            "customers",
            vec![
                doc! {"$replaceWith": {"$mergeObjects": [{"firstname": "$firstname"}, "$custom"]}},
                doc! {"$sort": {"firstname": 1}},
            ],
        ),
        // Stages after one that moved documents: their fields are named in
        // the form they were stored in, not in that of their new place
        // (`vip`, a short name, is a token only below `custom`; `count` is
        // a stored name, and the one `$sortByCount` makes is not).
        case(
            "a custom subtree made the top, then matched",
            "customers",
            vec![
                doc! {"$replaceRoot": {"newRoot": "$custom"}},
                doc! {"$match": {"vip": true}},
                doc! {"$sort": {"Favorite Player": 1}},
            ],
        ),
        case(
            "a custom subtree moved, then sorted below its new place",
            "customers",
            vec![
                doc! {"$project": {"c": "$custom"}},
                doc! {"$sort": {"c.vip": -1, "_id": 1}},
            ],
        ),
        case(
            "documents joined under as, then matched below it",
            "customers",
            vec![
                doc! {"$lookup": {"from": "customers", "localField": "region", "foreignField": "region", "as": "peers"}},
                doc! {"$unwind": "$peers"},
                doc! {"$match": {"peers.custom.vip": true}},
                doc! {"$project": {"peer": "$peers._id"}},
                doc! {"$sort": {"_id": 1, "peer": 1}},
            ],
        ),
        case(
            "a facet's documents, matched below it",
            "customers",
            vec![
                doc! {"$facet": {"vips": [{"$match": {"custom.vip": true}}]}},
                doc! {"$unwind": "$vips"},
                doc! {"$match": {"vips.custom.vip": true}},
                doc! {"$project": {"id": "$vips._id"}},
            ],
        ),
        case(
            "whole documents pushed, then matched below",
            "customers",
            vec![
                doc! {"$group": {"_id": "$region", "docs": {"$push": "$$ROOT"}}},
                doc! {"$unwind": "$docs"},
                doc! {"$match": {"docs.custom.vip": true}},
                doc! {"$project": {"id": "$docs._id"}},
                doc! {"$sort": {"id": 1}},
            ],
        ),
        case(
            "the count $sortByCount makes",
            "customers",
            vec![
                doc! {"$sortByCount": "$region"},
                doc! {"$match": {"count": {"$gte": 2}}},
                doc! {"$sort": {"_id": 1}},
            ],
        ),
        case(
            "either of two forms, named where they agree",
            "customers",
            vec![
                doc! {"$set": {"either": {"$ifNull": ["$nothing", "$custom"]}}},
                doc! {"$sort": {"either.Loyalty Tier": 1, "_id": 1}},
                doc! {"$project": {"either": 1}},
            ],
        ),
        case(
            "lookup local/foreign",
            "customers",
            vec![
                doc! {"$lookup": {"from": "stockData", "localField": "portfolio", "foreignField": "symbol", "as": "stock_rows"}},
                doc! {"$project": {"stock_rows.symbol": 1, "stock_rows.volume": 1}},
                by_id.clone(),
            ],
        ),
        Case {
            name: "seed 004: the original $lookup pipeline",
            coll: "customers",
            pipeline: vec![
                doc! {"$match": {"region": "WEST"}},
                doc! {"$unwind": {"path": "$portfolio"}},
                doc! {"$lookup": {
                    "from": "stockData",
                    "let": {"symbol": "$portfolio", "start": day_start, "end": day_end},
                    "pipeline": seed_lookup_stages.clone(),
                    "as": "stockData",
                }},
                doc! {"$unwind": {"path": "$stockData"}},
                doc! {"$group": {
                    "_id": "$_id", "region": {"$first": "$region"}, "firstname": {"$first": "$firstname"},
                    "lastname": {"$first": "$lastname"}, "portfolio": {"$addToSet": "$portfolio"},
                    "stockActivity": {"$push": "$stockData"},
                }},
                by_id.clone(),
            ],
            sets: true,
        },
        Case {
            name: "seed 004: the single-collection pipeline",
            coll: "stockActivity",
            pipeline: vec![
                doc! {"$match": {"$and": [
                    {"regions.region": "WEST"},
                    {"$or": [{"_id.type": "customer"}, {"_id.type": "day", "_id.time": date("2023-02-07T00:00:00Z")}]},
                ]}},
                doc! {"$sort": {"_id.symbol": 1, "_id.customerID": 1}},
                doc! {"$group": {
                    "_id": "$_id.symbol", "volume": {"$sum": "$volume"}, "opening": {"$push": "$opening"},
                    "high": {"$max": "$high"}, "low": {"$min": "$low"}, "closing": {"$push": "$closing"},
                    "customers": {"$addToSet": {"$cond": {"if": {"$eq": ["$_id.type", "customer"]}, "then": "$$ROOT", "else": "$$REMOVE"}}},
                }},
                doc! {"$set": {"closing": {"$last": "$closing"}, "opening": {"$first": "$opening"}}},
                doc! {"$unwind": {"path": "$customers"}},
                doc! {"$group": {
                    "_id": "$customers._id.customerID",
                    "region": {"$first": {"$getField": {"field": "region", "input": {"$arrayElemAt": ["$customers.regions", 0]}}}},
                    "firstname": {"$first": "$customers.firstname"},
                    "lastname": {"$first": "$customers.lastname"},
                    "portfolio": {"$first": "$customers.portfolio"},
                    "stockActivity": {"$addToSet": {
                        "symbol": "$_id", "volume": "$volume", "opening": "$opening",
                        "high": "$high", "low": "$low", "closing": "$closing",
                    }},
                }},
                by_id.clone(),
            ],
            sets: true,
        },
        case(
            "graphLookup",
            "employees",
            vec![
                doc! {"$graphLookup": {
                    "from": "employees", "startWith": "$reports_to", "connectFromField": "reports_to",
                    "connectToField": "employee_name", "as": "management_chain", "depthField": "level",
                }},
                doc! {"$project": {"employee_name": 1, "chain_length": {"$size": "$management_chain"}}},
                by_id.clone(),
            ],
        ),
        case(
            "unionWith",
            "customers",
            vec![
                doc! {"$project": {"_id": 0, "label": "$lastname"}},
                doc! {"$unionWith": {"coll": "stockData", "pipeline": [{"$project": {"_id": 0, "label": "$symbol"}}]}},
                doc! {"$group": {"_id": "$label", "occurrences": {"$sum": 1}}},
                by_id.clone(),
            ],
        ),
        case(
            "setWindowFields",
            "customers",
            vec![
                doc! {"$setWindowFields": {
                    "partitionBy": "$region", "sortBy": {"score": 1},
                    "output": {"running_score": {"$sum": "$score", "window": {"documents": ["unbounded", "current"]}}},
                }},
                doc! {"$project": {"region": 1, "score": 1, "running_score": 1}},
                by_id.clone(),
            ],
        ),
        case(
            "densify",
            "customers",
            vec![
                doc! {"$project": {"score": 1}},
                doc! {"$densify": {"field": "score", "range": {"step": 4, "bounds": "full"}}},
                doc! {"$sort": {"score": 1}},
            ],
        ),
        case(
            "fill",
            "customers",
            vec![
                doc! {"$project": {"score": 1, "reports_to": 1}},
                doc! {"$fill": {"sortBy": {"score": 1}, "output": {"reports_to": {"value": "nobody"}}}},
                by_id.clone(),
            ],
        ),
        case(
            "arrayElemAt",
            "customers",
            vec![
                doc! {"$project": {"first_order": {"$arrayElemAt": ["$orders", 0]}}},
                by_id.clone(),
            ],
        ),
        case(
            "filter",
            "customers",
            vec![
                doc! {"$project": {"expensive_orders": {"$filter": {"input": "$orders", "as": "order_line", "cond": {"$gt": ["$$order_line.price", 15]}}}}},
                by_id.clone(),
            ],
        ),
        case(
            "map",
            "customers",
            vec![
                doc! {"$project": {"order_totals": {"$map": {"input": "$orders", "as": "line", "in": {"line_total": {"$multiply": ["$$line.price", "$$line.quantity"]}}}}}},
                by_id.clone(),
            ],
        ),
        case(
            "reduce",
            "customers",
            vec![
                doc! {"$project": {"spent": {"$reduce": {"input": "$orders", "initialValue": 0, "in": {"$add": ["$$value", "$$this.price"]}}}}},
                by_id.clone(),
            ],
        ),
        case(
            "sortArray",
            "customers",
            vec![
                doc! {"$project": {"sorted_orders": {"$sortArray": {"input": "$orders", "sortBy": {"price": -1}}}}},
                by_id.clone(),
            ],
        ),
        case(
            "top",
            "customers",
            vec![
                doc! {"$group": {"_id": "$region", "best": {"$top": {"sortBy": {"score": -1}, "output": ["$lastname", "$score"]}}}},
                by_id.clone(),
            ],
        ),
        case(
            "getField",
            "customers",
            vec![
                doc! {"$project": {"tier": {"$getField": {"field": "Loyalty Tier", "input": "$custom"}}, "addr": {"$getField": "address"}}},
                by_id.clone(),
            ],
        ),
        case(
            "setField",
            "customers",
            vec![
                doc! {"$project": {"with_city": {"$setField": {"field": "city_name", "input": "$address", "value": "X"}}}},
                by_id.clone(),
            ],
        ),
        case(
            "let",
            "customers",
            vec![
                doc! {"$project": {"home": {"$let": {"vars": {"addr": "$address"}, "in": "$$addr.city"}}}},
                by_id.clone(),
            ],
        ),
        case(
            "ROOT and CURRENT",
            "customers",
            vec![
                doc! {"$project": {"given": "$$ROOT.firstname", "town": "$$CURRENT.address.city"}},
                by_id.clone(),
            ],
        ),
        case(
            "redact",
            "customers",
            vec![
                doc! {"$redact": {"$cond": {"if": {"$eq": ["$region", "EAST"]}, "then": "$$PRUNE", "else": "$$DESCEND"}}},
                by_id.clone(),
            ],
        ),
        case(
            "switch and dates",
            "customers",
            vec![
                doc! {"$project": {
                    "band": {"$switch": {"branches": [{"case": {"$lt": ["$score", 5]}, "then": "low"}, {"case": {"$lt": ["$score", 10]}, "then": "mid"}], "default": "high"}},
                    "joined_year": {"$dateToString": {"format": "%Y-%m", "date": "$joined"}},
                }},
                by_id.clone(),
            ],
        ),
        case(
            "skip and limit",
            "customers",
            vec![
                by_id.clone(),
                doc! {"$skip": 1},
                doc! {"$limit": 2},
                doc! {"$project": {"lastname": 1}},
            ],
        ),
        case(
            "firstN",
            "customers",
            vec![
                by_id.clone(),
                doc! {"$group": {"_id": "$region", "first_names": {"$firstN": {"input": "$firstname", "n": 2}}}},
                by_id.clone(),
            ],
        ),
        case(
            "documents",
            "",
            vec![
                doc! {"$documents": [{"alpha_value": 1, "nested_doc": {"inner_value": 2}}, {"alpha_value": 3}]},
                doc! {"$match": {"alpha_value": {"$gte": 1}}},
            ],
        ),
    ]
}

#[tokio::test]
async fn a_corpus_of_pipelines_gives_what_it_gives_on_an_untokenized_twin() {
    let proxy = tokenizing_proxy("agg").await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("agg", "proxy"));
    let direct = common::direct().await.database(&db_name("agg", "direct"));
    load(&via).await;
    load(&direct).await;
    let corpus = corpus();
    assert!(corpus.len() >= 40, "{} pipelines", corpus.len());
    let mut failures = Vec::new();
    for c in &corpus {
        let through = aggregate(&via, c.coll, &c.pipeline).await;
        let twin = aggregate(&direct, c.coll, &c.pipeline).await;
        let (through, twin) = match (through, twin) {
            (Ok(a), Ok(b)) if c.sets => (
                Ok(a.iter()
                    .map(|d| unordered(&Bson::Document(d.clone())))
                    .collect::<Vec<_>>()),
                Ok(b.iter()
                    .map(|d| unordered(&Bson::Document(d.clone())))
                    .collect()),
            ),
            (Ok(a), Ok(b)) => (
                Ok(a.into_iter().map(Bson::Document).collect()),
                Ok(b.into_iter().map(Bson::Document).collect()),
            ),
            (Err((code, msg)), other) => (
                Err((code, msg.replace("agg_proxy", "agg_direct"))),
                other.map(|b| b.into_iter().map(Bson::Document).collect()),
            ),
            (a, Err(e)) => (
                a.map(|a| a.into_iter().map(Bson::Document).collect()),
                Err(e),
            ),
        };
        if through != twin {
            failures.push(format!(
                "{}:\n  through Laconic: {through:?}\n  directly:        {twin:?}",
                c.name
            ));
        }
        match &twin {
            Ok(docs) => assert!(!docs.is_empty(), "{}: the twin returned nothing", c.name),
            Err(e) => eprintln!("{}: the upstream refuses it directly too: {e:?}", c.name),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} pipelines differ:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );

    // Names are stored as tokens, so the pipelines above did run on tokens.
    let stored = common::stored(&db_name("agg", "proxy"), "customers").await;
    assert!(!stored[0].contains_key("firstname"), "{:?}", stored[0]);
}

#[tokio::test]
async fn out_and_merge_store_tokens_that_read_back_as_on_the_twin() {
    let proxy = tokenizing_proxy("aggout").await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("aggout", "proxy"));
    let direct = common::direct()
        .await
        .database(&db_name("aggout", "direct"));
    let mut results = Vec::new();
    for db in [&via, &direct] {
        load(db).await;
        let c = db.collection::<Document>("customers");
        c.aggregate(vec![doc! {"$project": {"lastname": 1, "score_band": {"$cond": [{"$gt": ["$score", 8]}, "high", "low"]}}}, doc! {"$out": "customer_bands"}])
            .await
            .unwrap();
        c.aggregate(vec![
            doc! {"$group": {"_id": "$region", "regional_total": {"$sum": "$score"}}},
            doc! {"$merge": {"into": "region_totals", "on": "_id", "whenMatched": "replace", "whenNotMatched": "insert"}},
        ])
        .await
        .unwrap();
        let bands: Vec<Document> = common::by_id(
            &db.collection("customer_bands"),
            doc! {"score_band": "high"},
        )
        .await;
        let totals: Vec<Document> = common::by_id(
            &db.collection("region_totals"),
            doc! {"regional_total": {"$gt": 0}},
        )
        .await;
        results.push((bands, totals));
    }
    assert_eq!(results[0], results[1]);
    assert!(!results[0].0.is_empty() && !results[0].1.is_empty());
    // The written documents hold tokens for names of four bytes or more.
    let stored = common::stored(&db_name("aggout", "proxy"), "customer_bands").await;
    assert!(
        !stored[0].contains_key("score_band") && !stored[0].contains_key("lastname"),
        "{:?}",
        stored[0]
    );
}

#[tokio::test]
async fn constructs_that_cannot_be_rewritten_are_refused_with_their_name() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.store_db = db_name("aggref", "store");
    let db_name_proxy = db_name("aggref", "proxy");
    config.tokenize.namespaces = vec![laconic::config::NamespaceTokenize {
        namespace: format!("{db_name_proxy}.plain"),
        min_len: Some(0),
        ..Default::default()
    }];
    let proxy = common::start(config).await;
    let db = common::via_proxy(&proxy).await.database(&db_name_proxy);
    db.drop().await.unwrap();
    db.collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "long_name": {"inner": 1}})
        .await
        .unwrap();
    let out_refusal = format!("$out into {db_name_proxy}.plain cannot be rewritten: its collection's tokenize settings differ from the source's");
    let cases: Vec<(Document, &str)> = vec![
        (doc! {"$match": {"$where": "this.long_name"}}, "$where (JavaScript reads field names) cannot be rewritten to tokenized names"),
        (doc! {"$project": {"x": {"$function": {"body": "function(d) { return d }", "args": ["$$ROOT"], "lang": "js"}}}}, "$function (JavaScript reads field names) cannot be rewritten to tokenized names"),
        (doc! {"$group": {"_id": null, "x": {"$accumulator": {"init": "function() {}"}}}}, "$accumulator (JavaScript reads field names) cannot be rewritten to tokenized names"),
        (doc! {"$project": {"x": {"$getField": {"field": {"$concat": ["long", "_name"]}, "input": "$$ROOT"}}}}, "$getField with a computed field name (only a constant name can be rewritten) cannot be rewritten to tokenized names"),
        (doc! {"$project": {"x": {"$objectToArray": "$long_name"}}}, "$objectToArray over a tokenized collection (it turns field names into data, or data into field names) cannot be rewritten to tokenized names"),
        (doc! {"$project": {"x": {"$arrayToObject": [[["k", 1]]]}}}, "$arrayToObject over a tokenized collection (it turns field names into data, or data into field names) cannot be rewritten to tokenized names"),
        (doc! {"$search": {"text": {"query": "x", "path": "long_name"}}}, "the Atlas Search stage $search (its paths are resolved by the search index, over stored names) cannot be rewritten to tokenized names"),
        (doc! {"$out": "plain"}, &out_refusal),
        (doc! {"$madeUpStage": {}}, "the aggregation stage $madeUpStage is unknown to Laconic, so the field names it may carry cannot be rewritten"),
        (doc! {"$project": {"x": {"$setField": {"field": "$long_name", "input": "$$ROOT", "value": 1}}}}, "$setField with a computed field name (only a constant name can be rewritten) cannot be rewritten to tokenized names"),
        (doc! {"$match": {"$jsonSchema": {"patternProperties": {"^long": {"bsonType": "int"}}}}}, "$jsonSchema patternProperties (a regular expression over field names) cannot be rewritten to tokenized names"),
        (doc! {"$lookup": {"from": {"db": "elsewhere", "coll": "c"}, "localField": "long_name", "foreignField": "x", "as": "joined"}}, "$lookup from elsewhere.c cannot be rewritten: its database has another dictionary (databases that share one are configured in [[proxy.tokenize.dictionaries]])"),
        (doc! {"$project": {"x": {"$madeUpOperator": "$long_name"}}}, "the expression operator $madeUpOperator is unknown to Laconic, so the field names it may carry cannot be rewritten"),
    ];
    let c = db.collection::<Document>("c");
    for (stage, message) in cases {
        let err = c
            .aggregate(vec![stage.clone()])
            .await
            .map(|_| ())
            .unwrap_err();
        let mongodb::error::ErrorKind::Command(e) = *err.kind else {
            panic!("{stage}: {err}")
        };
        assert_eq!(
            (e.code, e.code_name.as_str()),
            (115, "CommandNotSupported"),
            "{stage}"
        );
        assert_eq!(e.message, format!("laconic: {message}"), "{stage}");
    }
    // A stage naming fields that an earlier stage left stored in two forms.
    let err = c
        .aggregate(vec![
            doc! {"$set": {"x": {"$ifNull": ["$long_name", {"$literal": {"inner": 2}}]}}},
            doc! {"$match": {"x.inner": 2}},
        ])
        .await
        .map(|_| ())
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 115);
    assert_eq!(e.message, "laconic: the stage $match naming fields below x (an earlier stage put documents there that store them in more than one form) cannot be rewritten to tokenized names");
    // Unknown commands are refused too, unless declared free of names.
    let err = db
        .run_command(doc! {"madeUpCommand": "c", "long_name": 1})
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 115);
    assert_eq!(e.message, "laconic: the command madeUpCommand is unknown to Laconic, so the field names it may carry cannot be rewritten (list it in proxy.tokenize.pass_through if it carries none)");
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.store_db = db_name("aggref", "store");
    config.tokenize.pass_through = vec!["madeUpCommand".into(), "$madeUpStage".into()];
    let lenient = common::start(config).await;
    let ldb = common::via_proxy(&lenient).await.database(&db_name_proxy);
    for outcome in [
        ldb.run_command(doc! {"madeUpCommand": "c"})
            .await
            .map(|_| ()),
        ldb.collection::<Document>("c")
            .aggregate(vec![doc! {"$madeUpStage": {}}])
            .await
            .map(|_| ()),
    ] {
        // Forwarded: the upstream's own answer, not the proxy's refusal.
        if let Err(err) = outcome {
            if let mongodb::error::ErrorKind::Command(e) = *err.kind {
                assert!(!e.message.starts_with("laconic:"), "{}", e.message);
            }
        }
    }
    // A cluster-wide change stream cannot name document fields.
    let err = common::via_proxy(&proxy)
        .await
        .watch()
        .pipeline(vec![doc! {"$match": {"fullDocument.long_name": 1}}])
        .await
        .map(|_| ())
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 115);
    assert_eq!(e.message, "laconic: a stage naming document fields ($match) in a cluster-wide change stream cannot be rewritten: the databases have different dictionaries (one shared by every database is configured with databases = [\"*\"] in [[proxy.tokenize.dictionaries]]); watch the database or the collection instead");
    // mapReduce, as a command.
    let err = db
        .run_command(doc! {"mapReduce": "c", "map": "function() { emit(this.long_name, 1) }", "reduce": "function(k, v) { return 1 }", "out": {"inline": 1}})
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 115);
    assert_eq!(
        e.message,
        "laconic: mapReduce (JavaScript reads field names) cannot be rewritten to tokenized names"
    );
}

#[tokio::test]
async fn pipeline_updates_write_tokens_and_read_back_as_on_the_twin() {
    let proxy = tokenizing_proxy("aggupd").await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("aggupd", "proxy"));
    let direct = common::direct()
        .await
        .database(&db_name("aggupd", "direct"));
    let mut results = Vec::new();
    for db in [&via, &direct] {
        load(db).await;
        let c = db.collection::<Document>("customers");
        c.update_many(
            doc! {"region": "WEST"},
            vec![
                doc! {"$set": {"display_name": {"$concat": ["$firstname", " ", "$lastname"]}, "custom.Visit Count": {"$add": ["$score", 1]}}},
                doc! {"$unset": ["orders", "address.location"]},
            ],
        )
        .await
        .unwrap();
        c.update_one(
            doc! {"_id": "US2222222222"},
            vec![doc! {"$replaceWith": {"$mergeObjects": ["$$ROOT", {"promoted_region": "$region"}]}}],
        )
        .await
        .unwrap();
        let found = c
            .find_one_and_update(
                doc! {"_id": "US3333333333"},
                vec![doc! {"$set": {"score_doubled": {"$multiply": ["$score", 2]}}}],
            )
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .unwrap();
        results.push((common::by_id(&c, doc! {}).await, found));
    }
    assert_eq!(results[0], results[1]);
    let stored = common::stored(&db_name("aggupd", "proxy"), "customers").await;
    assert!(
        stored.iter().all(|d| !d.contains_key("display_name")),
        "{:?}",
        stored[0]
    );
}
