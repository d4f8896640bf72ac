use bson::{doc, Bson, Document};

use super::*;
use crate::rewrite::catalogue::{Slot, Stores, CATALOGUE};
use crate::rewrite::names::{Misses, Noting};
use crate::token::{Dictionary, Migration};

fn cmd(body: Document) -> Command {
    let raw = bson::RawDocumentBuf::from_document(&body).unwrap();
    Command::from_msg(&crate::wire::OpMsg::from_body(
        crate::wire::MsgFlags::default(),
        &raw,
    ))
    .unwrap()
}

/// Policies tokenizing names of 6+ bytes in `app`, with `app.people`
/// in the given migration state, and a dictionary that knows the names.
fn migrating(state: crate::token::MigrationState) -> (Policies, crate::token::Dictionary) {
    let policies = Policies::new(Policy::new(6, &[], "laconic"));
    policies
        .migrating
        .replace([("app.people".to_owned(), state)].into_iter().collect());
    let mut dict = crate::token::Dictionary::default();
    dict.add_names(&["first_name".to_owned(), "last_name".to_owned()]);
    (policies, dict)
}

#[test]
fn while_migrating_partial_updates_name_the_stored_form_only() {
    use crate::token::MigrationState as State;
    let (policies, dict) = migrating(State::Migrating(Migration::Forward));
    let tok = |n: &str| {
        crate::token::Names::token(&dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let (first, last) = (tok("first_name"), tok("last_name"));
    let update = cmd(doc! {
        "update": "people", "$db": "app",
        "updates": [
            {"q": {"first_name": "x"}, "u": {"$set": {"last_name": 1}}, "upsert": true},
            {"q": {"first_name": "y"}, "u": {"first_name": "z"}},
        ],
    });
    // The documents the operator update will meet, in either form...
    let names = |_: &str| Some(&dict as &dyn Names);
    let converting = |filter: Document| Converting {
        db: "app".into(),
        coll: "people".into(),
        filter,
    };
    assert_eq!(
        migration_filters(&update, &policies, &names).unwrap(),
        vec![converting(
            doc! {"$or": [{&first: "x"}, {"first_name": "x"}]}
        )]
    );
    // ...are brought to the stored form first, so its filter names
    // that form alone; the replacement's filter matches both.
    let mut rewritten = update.clone();
    command(&mut rewritten, "app", &policies, Lookup::of(&dict)).unwrap();
    let ops = rewritten.body.get_array("updates").unwrap();
    assert_eq!(
        ops[0].as_document().unwrap(),
        &doc! {"q": {&first: "x"}, "u": {"$set": {&last: 1}}, "upsert": true}
    );
    assert_eq!(
        ops[1].as_document().unwrap().get_document("q").unwrap(),
        &doc! {"$or": [{&first: "y"}, {"first_name": "y"}]}
    );
    // A bulkWrite's operator updates are the same: converted ahead, then
    // named in the stored form. Its replacements and deletes match both.
    let bulk = cmd(doc! {
        "bulkWrite": 1, "$db": "admin",
        "nsInfo": [{"ns": "app.people"}, {"ns": "app.other"}],
        "ops": [
            {"update": 0, "filter": {"first_name": "x"}, "updateMods": {"$set": {"last_name": 1}}},
            {"update": 1, "filter": {"first_name": "x"}, "updateMods": {"$set": {"last_name": 1}}},
            {"update": 0, "filter": {"first_name": "y"}, "updateMods": {"first_name": "z"}},
            {"delete": 0, "filter": {"first_name": "w"}},
        ],
    });
    assert_eq!(
        migration_filters(&bulk, &policies, &names).unwrap(),
        vec![converting(
            doc! {"$or": [{&first: "x"}, {"first_name": "x"}]}
        )]
    );
    let mut rewritten = bulk.clone();
    let lookup = |db: &str| (db == "app").then(|| Lookup::of(&dict));
    bulk_write(&mut rewritten, &policies, &lookup).unwrap();
    let ops = rewritten.body.get_array("ops").unwrap();
    let op = |i: usize| ops[i].as_document().unwrap();
    assert_eq!(
        op(0),
        &doc! {"update": 0, "filter": {&first: "x"}, "updateMods": {"$set": {&last: 1}}}
    );
    assert_eq!(
        op(1),
        &doc! {"update": 1, "filter": {&first: "x"}, "updateMods": {"$set": {&last: 1}}}
    );
    for i in [2, 3] {
        let filter = op(i).get_document("filter").unwrap();
        assert!(filter.contains_key("$or"), "{filter}");
    }
    // Not migrating: nothing to bring over.
    let other = cmd(doc! {"update": "other", "$db": "app",
    "updates": [{"q": {"first_name": "x"}, "u": {"$set": {"last_name": 1}}}]});
    assert!(migration_filters(&other, &policies, &names)
        .unwrap()
        .is_empty());
}

#[test]
fn during_and_after_a_reverse_migration_writes_keep_full_names() {
    use crate::token::MigrationState as State;
    let write = cmd(doc! {
        "update": "people", "$db": "app",
        "updates": [{"q": {"first_name": "x"}, "u": {"$inc": {"last_name": 1}}}],
    });
    let insert = cmd(doc! {"insert": "people", "$db": "app",
    "documents": [{"_id": 1, "first_name": "x"}]});
    let (policies, dict) = migrating(State::Migrating(Migration::Reverse));
    let first = crate::token::Names::token(&dict, "first_name")
        .unwrap()
        .as_str()
        .to_owned();
    let names = |_: &str| Some(&dict as &dyn Names);
    assert_eq!(
        migration_filters(&write, &policies, &names).unwrap(),
        vec![Converting {
            db: "app".into(),
            coll: "people".into(),
            filter: doc! {"$or": [{&first: "x"}, {"first_name": "x"}]},
        }]
    );
    for policies in [policies, migrating(State::Reversed).0] {
        for c in [&write, &insert] {
            let mut rewritten = c.clone();
            command(&mut rewritten, "app", &policies, Lookup::of(&dict)).unwrap();
            assert_eq!(rewritten.body, c.body);
        }
    }
    let (reversed, _) = migrating(State::Reversed);
    assert!(migration_filters(&write, &reversed, &names)
        .unwrap()
        .is_empty());
    assert!(!reversed.get("app", "people").is_active());
    assert!(reversed.get("app", "others").is_active());
}

/// A value for each slot holding one tokenizable name, its own
/// (`slot_name_<n>`), so that a slot a pass ignores shows up as a name it
/// left as it was.
fn sample(slots: &[Slot], n: &mut usize, names: &mut Vec<(String, bool)>) -> Document {
    fn next_name(n: &mut usize, stored: bool, names: &mut Vec<(String, bool)>) -> String {
        *n += 1;
        let name = format!("slot_name_{n}");
        names.push((name.clone(), stored));
        name
    }
    let mut d = Document::new();
    for slot in slots {
        match *slot {
            Slot::Filter(k) => {
                d.insert(k, doc! {next_name(n, false, names): 1});
            }
            Slot::Documents(k) => {
                d.insert(k, vec![doc! {next_name(n, true, names): 1}]);
            }
            Slot::Document(k) => {
                d.insert(k, doc! {next_name(n, true, names): 1});
            }
            Slot::Update {
                filter,
                update,
                array_filters,
            } => {
                d.insert(filter, doc! {next_name(n, true, names): 1});
                d.insert(update, doc! {"$set": {next_name(n, true, names): 1}});
                d.insert("upsert", true);
                d.insert(
                    array_filters,
                    vec![doc! {format!("elem.{}", next_name(n, false, names)): 1}],
                );
            }
            Slot::Projection(k) | Slot::Sort(k) | Slot::Hint(k) | Slot::Keys(k) => {
                d.insert(k, doc! {next_name(n, false, names): 1});
            }
            Slot::Path(k) => {
                d.insert(k, next_name(n, false, names));
            }
            Slot::Pipeline(k) => {
                d.insert(k, vec![doc! {"$match": {next_name(n, false, names): 1}}]);
            }
            Slot::Let(k) => {
                d.insert(k, doc! {"v": format!("${}", next_name(n, false, names))});
            }
            Slot::Each(k, inner) => {
                d.insert(k, vec![sample(inner, n, names)]);
            }
            Slot::Within(k, inner) => {
                d.insert(k, sample(inner, n, names));
            }
            Slot::View { on, pipeline } => {
                d.insert(on, "other");
                d.insert(
                    pipeline,
                    vec![doc! {"$match": {next_name(n, false, names): 1}}],
                );
            }
            Slot::Explain(k) => {
                d.insert(
                    k,
                    doc! {"find": "c", "filter": {next_name(n, false, names): 1}},
                );
            }
            Slot::BulkOps => {
                d.insert("nsInfo", vec![doc! {"ns": "app.c"}]);
                d.insert(
                    "ops",
                    vec![
                        doc! {"insert": 0, "document": {next_name(n, true, names): 1}},
                        doc! {"update": 0, "filter": {next_name(n, false, names): 1}, "updateMods": {"$set": {next_name(n, true, names): 1}}},
                        doc! {"delete": 0, "filter": {next_name(n, false, names): 1}},
                    ],
                );
            }
        }
    }
    d
}

/// Every catalogue entry through the passes that walk it: each slot's name
/// is noted as missing (stored or read, as the entry says) by a dictionary
/// that lacks it, and replaced by its token by one that has it.
#[test]
fn every_slot_of_every_command_is_walked() {
    let policies = Policies::new(Policy::new(4, &[], "laconic"));
    for entry in CATALOGUE.iter().filter(|e| !e.slots.is_empty()) {
        let mut names = Vec::new();
        let mut body = doc! {entry.name: "c", "$db": "app"};
        body.extend(sample(entry.slots, &mut 0, &mut names));
        if entry.stores == Stores::Output {
            body.insert(
                "pipeline",
                vec![doc! {"$match": {"slot_name_1": 1}}, doc! {"$out": "c"}],
            );
        }
        let everything = matches!(entry.stores, Stores::Everything | Stores::Output);

        // Nothing known yet: every name is noted, stored or read.
        let misses = std::cell::RefCell::new(Misses::default());
        let noting = |storing| Noting {
            inner: std::sync::Arc::new(Dictionary::default()),
            db: "app",
            misses: &misses,
            storing,
        };
        let (read, store) = (noting(false), noting(true));
        let mut c = cmd(body.clone());
        command(
            &mut c,
            "app",
            &policies,
            Lookup {
                read: &read,
                store: &store,
            },
        )
        .unwrap();
        let m = misses.into_inner();
        for (name, stored) in &names {
            let in_stored = m.stored_names.iter().any(|(_, n)| n == name);
            let in_read = m.read_names.iter().any(|(_, n)| n == name);
            assert!(
                in_stored || in_read,
                "{}: {name} was not looked up",
                entry.name
            );
            assert_eq!(
                in_stored,
                *stored || everything,
                "{}: {name} stored?",
                entry.name
            );
        }

        // Every name known: none is left in its logical form.
        let mut dict = Dictionary::default();
        dict.add_names(&names.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>());
        let mut c = cmd(body);
        command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap();
        let text = format!("{:?}", c.body);
        for (name, _) in &names {
            assert!(
                !text.contains(name.as_str()),
                "{}: {name} left as it was in {text}",
                entry.name
            );
        }
    }
}

#[test]
fn commands_the_catalogue_does_not_list_are_refused_unless_declared() {
    let policies = Policies::new(Policy::new(4, &[], "laconic"));
    let dict = Dictionary::default();
    let mut c = cmd(doc! {"frobnicate": "c", "$db": "app", "filter": {"long_name": 1}});
    assert!(matches!(
        command(&mut c, "app", &policies, Lookup::of(&dict)),
        Err(ProxyError::Unsupported(_))
    ));
    let mut declared = policies.clone();
    declared.pass_through = vec!["frobnicate".into()];
    command(&mut c, "app", &declared, Lookup::of(&dict)).unwrap();
    let _ = Bson::Null;
}

/// `$redact` reads its paths in every embedded document it descends into:
/// rewritten when its names are stored alike at every depth, refused when a
/// depth stores them otherwise (here, a short name below a custom-attribute
/// path, as `custom.items.qty` holds it).
#[test]
fn redact_is_rewritten_only_for_names_stored_alike_at_every_depth() {
    let redact = |expr: Bson| {
        cmd(doc! {"aggregate": "c", "$db": "app", "cursor": {},
        "pipeline": [{"$redact": expr}]})
    };
    let by_length = Policies::new(Policy::new(4, &[], "laconic"));
    let custom = Policies::new(Policy::new(4, &["custom".into()], "laconic"));
    let mut dict = Dictionary::default();
    dict.add_names(&["quantity".to_owned()]);
    let quantity = crate::token::Names::token(&dict, "quantity")
        .unwrap()
        .as_str()
        .to_owned();
    let on = |path: &str| Bson::from(doc! {"$cond": [{"$eq": [path, 1]}, "$$PRUNE", "$$DESCEND"]});
    let mut c = redact(on("$quantity"));
    command(&mut c, "app", &custom, Lookup::of(&dict)).unwrap();
    let stage = &c.body.get_array("pipeline").unwrap()[0];
    assert_eq!(
        stage.as_document().unwrap().get("$redact").unwrap(),
        &on(&format!("${quantity}"))
    );
    for path in ["$qty", "$$CURRENT.qty", "$quantity.n"] {
        let mut c = redact(on(path));
        let e = command(&mut c, "app", &custom, Lookup::of(&dict)).unwrap_err();
        assert!(e.to_string().contains("$redact reading"), "{path}: {e}");
        let mut c = redact(on(path));
        command(&mut c, "app", &by_length, Lookup::of(&dict)).unwrap();
    }
    let mut c = redact(Bson::from(
        doc! {"$cond": [{"$eq": [{"$getField": "qty"}, 1]}, "$$PRUNE", "$$DESCEND"]},
    ));
    assert!(command(&mut c, "app", &custom, Lookup::of(&dict)).is_err());
    // Read from the top document alone: any name.
    let mut c = redact(on("$$ROOT.qty"));
    command(&mut c, "app", &custom, Lookup::of(&dict)).unwrap();
}

/// An update's conditions on array elements (`$pull`'s, and the
/// `arrayFilters` bound to `$[<id>]`) are rewritten as a filter on the
/// elements of that array: on a value path they compare value tokens,
/// below a custom-attribute path short names are tokenized, and literal
/// documents are in their stored form. `$push`'s `$sort` by value tokens is
/// refused.
#[test]
fn conditions_on_array_elements_are_read_where_the_array_is() {
    let policies = Policies::new(
        Policy::new(6, &["custom".into()], "laconic").with_value_paths(&["category".into()]),
    );
    let mut dict = Dictionary::default();
    dict.add_names(&[
        "category".to_owned(),
        "custom".to_owned(),
        "history".to_owned(),
        "qty".to_owned(),
        "quantity".to_owned(),
    ]);
    dict.add_values(&["music".to_owned()]);
    let names = |n: &str| {
        crate::token::Names::token(&dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let music = crate::rewrite::mapper::paths::value_literal(&Bson::from("music"), &dict);
    let update = |u: Document, filters: Vec<Document>| {
        cmd(doc! {"update": "c", "$db": "app",
        "updates": [{"q": {}, "u": u, "arrayFilters": filters}]})
    };
    let rewritten = |c: &mut Command| {
        command(c, "app", &policies, Lookup::of(&dict))?;
        Ok::<_, ProxyError>(
            c.body.get_array("updates").unwrap()[0]
                .as_document()
                .unwrap()
                .clone(),
        )
    };

    let mut c = update(doc! {"$pull": {"category": {"$in": ["music"]}}}, vec![]);
    let op = rewritten(&mut c).unwrap();
    assert_eq!(
        op.get_document("u").unwrap(),
        &doc! {"$pull": {names("category"): {"$in": [music.clone()]}}}
    );
    let mut c = update(doc! {"$pull": {"category": {"$eq": "music"}}}, vec![]);
    let op = rewritten(&mut c).unwrap();
    assert_eq!(
        op.get_document("u").unwrap(),
        &doc! {"$pull": {names("category"): {"$eq": music.clone()}}}
    );

    let mut c = update(
        doc! {"$set": {"category.$[e]": "rock", "custom.list.$[i].qty": 1}},
        vec![
            doc! {"e": "music"},
            doc! {"i.qty": {"$gte": 2}, "i": {"quantity": 1}},
        ],
    );
    let op = rewritten(&mut c).unwrap();
    assert_eq!(
        op.get_array("arrayFilters").unwrap(),
        &vec![
            Bson::from(doc! {"e": music}),
            Bson::from(doc! {
                format!("i.{}", names("qty")): {"$gte": 2},
                "i": {names("quantity"): 1},
            }),
        ]
    );

    // `$push`'s `$sort` keys are paths in the array's elements.
    let mut c = update(
        doc! {"$push": {"history": {"$each": [{"quantity": 1}], "$sort": {"quantity": 1, "custom.qty": -1}}}},
        vec![],
    );
    let op = rewritten(&mut c).unwrap();
    assert_eq!(
        op.get_document("u").unwrap(),
        &doc! {"$push": {names("history"): {
            "$each": [{names("quantity"): 1}],
            "$sort": {names("quantity"): 1, format!("{}.qty", names("custom")): -1},
        }}}
    );

    for refused in [
        doc! {"$push": {"category": {"$each": ["a"], "$sort": 1}}},
        doc! {"$pull": {"category": {"$gt": "m"}}},
    ] {
        let mut c = update(refused.clone(), vec![]);
        let e = rewritten(&mut c).unwrap_err();
        assert!(
            e.to_string().contains("tokenized value path"),
            "{refused}: {e}"
        );
    }
}

/// `$jsonSchema` at a value path: a string is stored there as a value
/// token, so a keyword reading a string's type or text is refused, and
/// `enum` compares value tokens; other types are kept as they are.
#[test]
fn a_json_schema_at_a_value_path_reads_what_is_stored() {
    let policies = Policies::new(Policy::new(4, &[], "laconic").with_value_paths(&["tags".into()]));
    let mut dict = Dictionary::default();
    dict.add_names(&["tags".to_owned()]);
    dict.add_values(&["rock".to_owned()]);
    let tags = crate::token::Names::token(&dict, "tags")
        .unwrap()
        .as_str()
        .to_owned();
    let rock = crate::rewrite::mapper::paths::value_literal(&Bson::from("rock"), &dict);
    let find =
        |schema: Document| cmd(doc! {"find": "c", "$db": "app", "filter": {"$jsonSchema": schema}});
    let mut c =
        find(doc! {"properties": {"tags": {"bsonType": "array", "items": {"enum": ["rock", 1]}}}});
    command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap();
    assert_eq!(
        c.body.get_document("filter").unwrap(),
        &doc! {"$jsonSchema": {"properties": {&tags: {"bsonType": "array", "items": {"enum": [rock, 1]}}}}}
    );
    for refused in [
        doc! {"properties": {"tags": {"bsonType": "array", "items": {"bsonType": "string"}}}},
        doc! {"properties": {"tags": {"bsonType": ["string", "null"]}}},
        doc! {"properties": {"tags": {"items": {"maxLength": 3}}}},
    ] {
        let mut c = find(refused.clone());
        let e = command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap_err();
        assert!(
            e.to_string().contains("tokenized value path tags"),
            "{refused}: {e}"
        );
    }
}

/// A join compares two paths' values: a value path (tokens) with a path
/// holding strings never matches, so such a `$lookup` or `$graphLookup`
/// is refused, and so is a `$lookup` variable reading a value path;
/// value path with value path, or plain with plain, is kept.
#[test]
fn joins_between_value_tokens_and_strings_are_refused() {
    let policies = Policies::new(
        Policy::new(4, &[], "laconic").with_value_paths(&["tags".into(), "place.city".into()]),
    );
    let dict = Dictionary::default();
    let aggregate = |stage: Document| {
        cmd(doc! {"aggregate": "c", "$db": "app", "cursor": {}, "pipeline": [stage]})
    };
    let lookup = |local: &str, foreign: &str| {
        aggregate(
            doc! {"$lookup": {"from": "c", "localField": local, "foreignField": foreign, "as": "m"}},
        )
    };
    let graph = |start: Bson, from: &str, to: &str| {
        aggregate(doc! {"$graphLookup": {"from": "c", "startWith": start,
        "connectFromField": from, "connectToField": to, "as": "g"}})
    };
    let kept = [
        lookup("tags", "tags"),
        lookup("name", "label"),
        lookup("place.city", "tags"),
        graph(Bson::from("$tags"), "tags", "tags"),
        graph(Bson::from("$name"), "next", "name"),
        graph(Bson::from(vec![Bson::from("$name")]), "next", "name"),
    ];
    for mut c in kept {
        command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap();
    }
    let refused = [
        lookup("name", "tags"),
        lookup("tags", "name"),
        graph(Bson::from("$name"), "next", "tags"),
        graph(Bson::from("$tags"), "tags", "name"),
        graph(Bson::from("$tags"), "next", "tags"),
        graph(Bson::from("rock"), "tags", "tags"),
        graph(Bson::from(vec![Bson::from("$tags")]), "next", "name"),
        // A variable carries the tokens into the sub-pipeline, where they
        // meet another collection's strings.
        aggregate(
            doc! {"$lookup": {"from": "o", "let": {"v": "$tags"}, "as": "m",
            "pipeline": [{"$match": {"$expr": {"$eq": ["$label", "$$v"]}}}]}},
        ),
        aggregate(
            doc! {"$lookup": {"from": "o", "let": {"v": {"$first": "$place.city"}}, "as": "m",
            "pipeline": [{"$match": {"$expr": {"$eq": ["$label", "$$v"]}}}]}},
        ),
        aggregate(
            doc! {"$lookup": {"from": "o", "let": {"v": "$$ROOT.tags"}, "as": "m",
            "pipeline": [{"$match": {"$expr": {"$eq": ["$label", "$$v"]}}}]}},
        ),
    ];
    for mut c in refused {
        let e = command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap_err();
        assert!(e.to_string().contains("tokenized value path"), "{e}");
    }
    let mut c = aggregate(
        doc! {"$lookup": {"from": "o", "let": {"v": "$label"}, "as": "m",
        "pipeline": [{"$match": {"$expr": {"$eq": ["$label", "$$v"]}}}]}},
    );
    command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap();
}

/// A subtree moved by an expression keeps the stored form of the place it
/// came from. Where the result is stored (a pipeline update, `$out`,
/// `$merge`), the documents must store their names as the collection does:
/// a move between places that store names otherwise (out of a
/// custom-attribute path, whose short names are tokenized, say; or another
/// collection's documents joined under a name) is refused. A read, whose
/// reply is expanded by the tokens' shape alone, goes on.
#[test]
fn a_stored_move_between_places_that_store_names_otherwise_is_refused() {
    let policies = Policies::new(Policy::new(4, &["custom".into()], "laconic"));
    let dict = Dictionary::default();
    let run = |body: Document| {
        let mut c = cmd(body);
        command(&mut c, "app", &policies, Lookup::of(&dict))
    };
    let update = |pipeline: Vec<Document>| {
        run(doc! {"update": "c", "$db": "app", "updates": [{"q": {}, "u": pipeline}]})
    };
    let aggregate = |pipeline: Vec<Document>| {
        run(doc! {"aggregate": "c", "$db": "app", "cursor": {}, "pipeline": pipeline})
    };
    let refused = |r: Result<(), ProxyError>, at: &str| {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "storing documents whose names at {at} an earlier stage moved there"
            )),
            "{e}"
        );
    };
    refused(update(vec![doc! {"$set": {"moved": "$custom"}}]), "moved");
    refused(
        update(vec![doc! {"$replaceWith": "$custom.sub"}]),
        "the top",
    );
    refused(
        aggregate(vec![
            doc! {"$project": {"c": "$$ROOT.custom"}},
            doc! {"$merge": {"into": "m"}},
        ]),
        "c",
    );
    refused(
        aggregate(vec![
            doc! {"$replaceRoot": {"newRoot": "$custom"}},
            doc! {"$out": "m"},
        ]),
        "the top",
    );
    // An attribute's value is a custom attribute's subtree wherever it
    // goes, and a plain document stays plain inside a custom path.
    refused(
        update(vec![doc! {"$set": {"custom.copy": "$other"}}]),
        "custom.copy",
    );
    refused(
        aggregate(vec![
            doc! {"$project": {"tier": "$custom.Loyalty Tier"}},
            doc! {"$merge": {"into": "m"}},
        ]),
        "tier",
    );
    // Whole documents moved under a name: the top's custom path with them.
    refused(
        aggregate(vec![
            doc! {"$lookup": {"from": "d", "localField": "a", "foreignField": "b", "as": "j"}},
            doc! {"$out": "m"},
        ]),
        "j.custom",
    );
    refused(
        aggregate(vec![
            doc! {"$group": {"_id": "$k", "docs": {"$push": "$$ROOT"}}},
            doc! {"$out": "m"},
        ]),
        "docs.custom",
    );
    // Within the same kind of place, or only read: rewritten.
    update(vec![
        doc! {"$set": {"custom.copy": "$custom.sub", "b": "$a"}},
    ])
    .unwrap();
    update(vec![
        doc! {"$replaceWith": {"$mergeObjects": ["$$ROOT", {"n": 1}]}},
    ])
    .unwrap();
    // `$map`'s elements come from the array its input passes on.
    update(vec![doc! {"$set": {"n": {"$map": {
        "input": {"$ifNull": ["$items", []]}, "as": "it", "in": {"$ifNull": ["$$it.qty", "$$it"]},
    }}}}])
    .unwrap();
    refused(
        update(vec![doc! {"$set": {"n": {"$map": {
            "input": {"$ifNull": ["$custom.list", []]}, "as": "it", "in": "$$it",
        }}}}]),
        "n",
    );
    aggregate(vec![doc! {"$replaceRoot": {"newRoot": "$custom"}}]).unwrap();
    aggregate(vec![doc! {"$merge": {"into": "c", "whenMatched": [
        {"$replaceWith": {"$mergeObjects": ["$$ROOT", "$$new"]}},
    ]}}])
    .unwrap();
    aggregate(vec![
        doc! {"$group": {"_id": "$k", "n": {"$sum": 1}, "first": {"$first": "$a"}}},
        doc! {"$out": "m"},
    ])
    .unwrap();
    // A view is queried under its own settings: one whose pipeline moves
    // names where they are stored otherwise is refused when it is made.
    let e = run(doc! {"create": "v", "$db": "app", "viewOn": "c",
    "pipeline": [{"$project": {"moved": "$custom"}}]})
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("a view whose documents store names at moved otherwise than its own tokenize settings say"),
        "{e}"
    );
    run(doc! {"create": "v", "$db": "app", "viewOn": "c",
    "pipeline": [{"$match": {"custom.qty": 1}}, {"$project": {"moved": "$a"}}]})
    .unwrap();
}

/// A stage after one that moved documents names their fields in the form
/// they were stored in: below a custom-attribute subtree made the top,
/// below another collection's documents joined under `as`, below names
/// the server makes (`count`), and below a place given documents of two
/// forms, not at all.
#[test]
fn later_stages_name_moved_fields_in_their_stored_form() {
    let policies = Policies::new(Policy::new(4, &["custom".into()], "laconic"));
    let mut dict = Dictionary::default();
    dict.add_names(&["qty".to_owned(), "count".to_owned(), "color".to_owned()]);
    let tok = |n: &str| {
        crate::token::Names::token(&dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let (qty, count, color) = (tok("qty"), tok("count"), tok("color"));
    let rewritten = |pipeline: Vec<Document>| {
        let mut c = cmd(doc! {"aggregate": "c", "$db": "app", "cursor": {}, "pipeline": pipeline});
        command(&mut c, "app", &policies, Lookup::of(&dict)).map(|()| {
            c.body
                .get_array("pipeline")
                .unwrap()
                .iter()
                .map(|s| s.as_document().unwrap().clone())
                .collect::<Vec<_>>()
        })
    };
    // Made the top: `qty` is a custom attribute's name, a token.
    let p = rewritten(vec![
        doc! {"$replaceRoot": {"newRoot": "$custom"}},
        doc! {"$match": {"qty": 5}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {&qty: 5}});
    // Moved under `m`: a token below it, plain beside it.
    let p = rewritten(vec![
        doc! {"$addFields": {"m": "$custom"}},
        doc! {"$match": {"m.qty": 2, "qty": 1}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {format!("m.{qty}"): 2, "qty": 1}});
    // Joined: the other collection's custom path sits below `j`.
    let p = rewritten(vec![
        doc! {"$lookup": {"from": "d", "localField": "a", "foreignField": "b", "as": "j"}},
        doc! {"$unwind": "$j"},
        doc! {"$sort": {"j.custom.qty": 1, "custom.qty": 1}},
    ])
    .unwrap();
    assert_eq!(
        p[2],
        doc! {"$sort": {format!("j.custom.{qty}"): 1, format!("custom.{qty}"): 1}}
    );
    // `count`, as `$sortByCount` names it, is plain; a stored one is not.
    let p = rewritten(vec![
        doc! {"$sortByCount": "$custom.color"},
        doc! {"$match": {"count": {"$gt": 1}}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {"count": {"$gt": 1}}});
    let p = rewritten(vec![doc! {"$match": {"count": 1, "color": 2}}]).unwrap();
    assert_eq!(p[0], doc! {"$match": {&count: 1, &color: 2}});
    // A `$map` variable over an array its input passes on is read in that
    // array's place: below `custom`, `qty` is a token.
    let p = rewritten(vec![doc! {"$project": {"q": {"$map": {
        "input": {"$ifNull": ["$custom.list", []]}, "as": "it", "in": "$$it.qty",
    }}}}])
    .unwrap();
    assert_eq!(
        p[0],
        doc! {"$project": {"q": {"$map": {
            "input": {"$ifNull": ["$custom.list", []]}, "as": "it", "in": format!("$$it.{qty}"),
        }}}}
    );
    // Either of two forms: a name they store alike is rewritten, one they
    // store otherwise is refused.
    let either = doc! {"$set": {"e": {"$ifNull": ["$custom", "$other"]}}};
    let e = rewritten(vec![either.clone(), doc! {"$match": {"e.qty": 1}}]).unwrap_err();
    assert!(
        e.to_string()
            .contains("the stage $match naming fields below e (an earlier stage put"),
        "{e}"
    );
    let p = rewritten(vec![
        either.clone(),
        doc! {"$match": {"e.color": 1, "qty": 1}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {format!("e.{color}"): 1, "qty": 1}});
    // A place nothing can tell the form of: refused below it.
    let unknown = doc! {"$set": {"u": {"$getField": {"field": "x", "input": {"$first": "$a"}}}}};
    let e = rewritten(vec![unknown.clone(), doc! {"$match": {"u.color": 1}}]).unwrap_err();
    assert!(
        e.to_string()
            .contains("naming fields below u after an earlier stage"),
        "{e}"
    );
    rewritten(vec![unknown, doc! {"$match": {"color": 1}}]).unwrap();
    // Below a key of digits, `custom` holds as a query reads it
    // (`7.custom` is `custom` to it): a subtree moved there from another
    // place cannot be read by that rule, and is refused below it; one
    // whose form the rule says is rewritten.
    let e = rewritten(vec![
        doc! {"$project": {"7": "$other"}},
        doc! {"$match": {"7.custom.qty": 1}},
    ])
    .unwrap_err();
    assert!(
        e.to_string().contains("naming fields below 7.custom after"),
        "{e}"
    );
    let p = rewritten(vec![
        doc! {"$project": {"7": "$other"}},
        doc! {"$match": {"7.color": 1}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {format!("7.{color}"): 1}});
    let p = rewritten(vec![
        doc! {"$project": {"7": "$$ROOT"}},
        doc! {"$match": {"7.custom.qty": 1}},
    ])
    .unwrap();
    assert_eq!(p[1], doc! {"$match": {format!("7.custom.{qty}"): 1}});
}

/// A stage's output key of digits alone is a field's name: the place it
/// computes is that field, not the top, whose `_id` stays as it is.
#[test]
fn a_field_named_with_digits_is_a_place_of_its_own() {
    let policies = Policies::new(Policy::new(1, &[], "laconic"));
    let mut dict = Dictionary::default();
    // `_id` is a name too: tokenized below the top.
    dict.add_names(&[
        "items".to_owned(),
        "qty".to_owned(),
        "x".to_owned(),
        "_id".to_owned(),
    ]);
    let tok = |n: &str| {
        crate::token::Names::token(&dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let (items, qty, x) = (tok("items"), tok("qty"), tok("x"));
    let mut c = cmd(
        doc! {"aggregate": "c", "$db": "app", "cursor": {}, "pipeline": [
            {"$project": {"7": {"$ifNull": ["$items.qty", []]}}},
            {"$project": {"x": "$_id"}},
        ]},
    );
    command(&mut c, "app", &policies, Lookup::of(&dict)).unwrap();
    assert_eq!(
        c.body.get_array("pipeline").unwrap(),
        &vec![
            Bson::Document(doc! {"$project": {"7": {"$ifNull": [format!("${items}.{qty}"), []]}}}),
            Bson::Document(doc! {"$project": {&x: "$_id"}}),
        ]
    );
}
