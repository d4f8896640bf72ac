use bson::{doc, Bson, Document};
use proptest::prelude::*;

use super::*;
use crate::rewrite::expand;
use crate::token::Policy;

type Dict = crate::token::Dictionary;

fn no_expr(_: &str, e: &Bson) -> Result<Bson, crate::error::ProxyError> {
    Ok(e.clone())
}

fn policy() -> Policy {
    Policy::new(6, &["custom".into()], "laconic")
}

fn store(doc: &Document, dict: &mut Dict) -> Document {
    store_with(doc, dict, &policy())
}

fn store_with(doc: &Document, dict: &mut Dict, policy: &Policy) -> Document {
    let mut names = Vec::new();
    collect_names(doc, policy, &mut names);
    dict.add_names(&names);
    let mut values = Vec::new();
    collect_values(doc, policy, &mut values);
    dict.add_values(&values);
    document(doc, &mut Vec::new(), policy, dict)
}

#[test]
fn values_at_value_paths_become_value_tokens_and_queries_follow() {
    let policy = policy().with_value_paths(&["top_artists".into()]);
    let mut dict = Dict::default();
    let logical =
        doc! {"_id": 1, "top_artists": ["Taylor Swift", "Bad Bunny"], "other": "Taylor Swift"};
    let stored = store_with(&logical, &mut dict, &policy);
    let artists = stored.values().nth(1).unwrap().as_array().unwrap();
    assert!(matches!(&artists[0], Bson::Binary(b) if b.bytes == vec![0]));
    assert_eq!(
        stored.values().nth(2).unwrap(),
        &Bson::from("Taylor Swift"),
        "other paths keep their values"
    );
    assert_eq!(expand::document(&stored, &dict).unwrap(), logical);

    let f = filter(
        &doc! {"top_artists": {"$regex": "^bad", "$options": "i"}},
        &[],
        &policy,
        &dict,
        &no_expr,
    )
    .unwrap();
    let in_list = f
        .values()
        .next()
        .unwrap()
        .as_document()
        .unwrap()
        .get_array("$in")
        .unwrap()
        .clone();
    assert_eq!(
        in_list.len(),
        2,
        "the token of Bad Bunny, and the expression itself: {in_list:?}"
    );
    let f = filter(
        &doc! {"top_artists": "Bad Bunny"},
        &[],
        &policy,
        &dict,
        &no_expr,
    )
    .unwrap();
    assert!(matches!(f.values().next().unwrap(), Bson::Binary(b) if b.bytes == vec![1]));
    // No value matches: the expression stays as it came, in either form
    // (`$in` it alone would be an equality to an upsert, which would store
    // the expression as the field's value).
    let none = bson::Regex {
        pattern: "^zzz".into(),
        options: String::new(),
    };
    for condition in [
        doc! {"top_artists": {"$regex": "^zzz", "$options": "i"}},
        doc! {"top_artists": none},
    ] {
        let f = filter(&condition, &[], &policy, &dict, &no_expr).unwrap();
        assert_eq!(f.values().next(), condition.values().next());
    }
}

/// A value path may hold documents of the user's too: they are stored as
/// any document is, so a filter compares them in that form, and an
/// `$elemMatch` of field conditions on such an array is a filter on them.
/// A range on a value path is refused wherever it sits.
#[test]
fn documents_at_a_value_path_are_matched_as_they_are_stored() {
    let policy = policy().with_value_paths(&["category".into(), "place.city".into()]);
    let mut dict = Dict::default();
    let logical = doc! {"_id": 1, "category": ["books", {"quantity": 68, "label": "x"}]};
    let stored = store_with(&logical, &mut dict, &policy);
    let t = |n: &str| {
        crate::token::Names::token(&dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let books = match &stored.get_array(t("category")).unwrap()[0] {
        b @ Bson::Binary(_) => b.clone(),
        other => panic!("{other:?}"),
    };
    let f = |f: Document| filter(&f, &[], &policy, &dict, &no_expr).unwrap();
    assert_eq!(
        f(doc! {"category": {"$elemMatch": {"quantity": {"$gte": 18}}}}),
        doc! {t("category"): {"$elemMatch": {t("quantity"): {"$gte": 18}}}}
    );
    assert_eq!(
        f(doc! {"category": {"$elemMatch": {"$eq": "books"}}}),
        doc! {t("category"): {"$elemMatch": {"$eq": books.clone()}}}
    );
    assert_eq!(
        f(doc! {"category": {"quantity": 68, "label": "x"}}),
        doc! {t("category"): {t("quantity"): 68, "label": "x"}}
    );
    assert_eq!(
        f(doc! {"category": {"$in": ["books", {"quantity": 68}]}}),
        doc! {t("category"): {"$in": [books, {t("quantity"): 68}]}}
    );
    for refused in [
        doc! {"category": {"$elemMatch": {"$gt": "a"}}},
        doc! {"place": {"$elemMatch": {"city": {"$gt": "P"}}}},
        doc! {"$or": [{"place.city": {"$type": "string"}}]},
    ] {
        let e = filter(&refused, &[], &policy, &dict, &no_expr).unwrap_err();
        assert!(
            e.to_string().contains("tokenized value path"),
            "{refused}: {e}"
        );
    }
}

#[test]
fn documents_shrink_and_expand_back_in_order() {
    let mut dict = Dict::default();
    let logical = doc! {
        "_id": 1, "first_name": "Jon", "ln": "Hyman",
        "custom": {"Favorite Player": "LeBron", "a.b$": 1, "x": [{"nested_field": 2}]},
        "\u{1}odd": true,
    };
    let stored = store(&logical, &mut dict);
    let keys: Vec<&String> = stored.keys().collect();
    assert_eq!(keys[0], "_id");
    assert_eq!(keys[2], "ln", "short names stay");
    assert_eq!(keys[4], "\u{1f}\u{1}odd", "colliding user keys are escaped");
    assert!(bson::to_vec(&stored).unwrap().len() < bson::to_vec(&logical).unwrap().len());
    assert!(expand::needed(&stored));
    assert_eq!(expand::document(&stored, &dict).unwrap(), logical);
}

#[test]
fn filters_projections_and_sorts_use_existing_tokens_only() {
    let mut dict = Dict::default();
    store(
        &doc! {"first_name": 1, "custom": {"Favorite Player": 1}, "sc": [{"points": 1}]},
        &mut dict,
    );
    let t = |n: &str| dict.token(n).unwrap().as_str().to_owned();
    let f = filter(
        &doc! {
            "first_name": "Jon",
            "custom.Favorite Player": {"$in": ["a", "b"]},
            "$or": [{"never_seen_name": 1}, {"custom": {"Favorite Player": "x"}}],
            "sc": {"$elemMatch": {"points": {"$gt": 1}}},
            "sc.0.points": 3,
        },
        &[],
        &policy(),
        &dict,
        &no_expr,
    )
    .unwrap();
    assert_eq!(
        f,
        doc! {
            t("first_name"): "Jon",
            format!("{}.{}", t("custom"), t("Favorite Player")): {"$in": ["a", "b"]},
            "$or": [{"never_seen_name": 1}, {t("custom"): {t("Favorite Player"): "x"}}],
            "sc": {"$elemMatch": {t("points"): {"$gt": 1}}},
            format!("sc.0.{}", t("points")): 3,
        }
    );
    let p = paths_document(
        &doc! {"first_name": 1, "custom.Favorite Player": 1, "_id": 0},
        &[],
        &policy(),
        &dict,
    );
    assert_eq!(
        p,
        doc! {t("first_name"): 1, format!("{}.{}", t("custom"), t("Favorite Player")): 1, "_id": 0}
    );
    // Expanding a dotted key pattern goes component by component.
    let pattern = doc! {format!("{}.{}", t("custom"), t("Favorite Player")): 1};
    assert_eq!(
        expand::document(&pattern, &dict).unwrap(),
        doc! {"custom.Favorite Player": 1}
    );
}

#[test]
fn unknown_tokens_are_reported_for_a_refresh() {
    let dict = Dict::default();
    let stored = doc! {"\u{4}": 1, "\u{1}": 2};
    assert_eq!(
        expand::document(&stored, &dict),
        Err(expand::Unknown {
            names: vec!["\u{1}".into(), "\u{4}".into()],
            values: vec![]
        }),
        "an unknown token, and a key that begins like one but spells none"
    );
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,12}",
        "\\PC{1,10}",
        "[\\x01-\\x1f][a-z.$]{0,4}",
        "[a-z]{1,3}\\.[\\x01-\\x05]x",
        "\\$?[a-z.]{1,6}"
    ]
}

fn arb_doc() -> impl Strategy<Value = Document> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        "\\PC{0,6}".prop_map(Bson::String),
        Just(Bson::Null)
    ];
    let value = leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            prop::collection::vec((arb_key(), inner), 0..5)
                .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
        ]
    });
    prop::collection::vec((arb_key(), value), 0..8).prop_map(|kv| kv.into_iter().collect())
}

proptest! {
    #[test]
    fn rewriting_then_expanding_gives_back_the_original(doc in arb_doc()) {
        let mut dict = Dict::default();
        let stored = store(&doc, &mut dict);
        prop_assert_eq!(expand::document(&stored, &dict).unwrap(), doc);
    }
}

proptest! {
    #[test]
    fn raw_expansion_agrees_with_owned_expansion(doc in arb_doc()) {
        let mut dict = Dict::default();
        let stored = store(&doc, &mut dict);
        let raw = bson::RawDocumentBuf::from_document(&stored).unwrap();
        let expanded = expand::raw_document(&raw, &dict).unwrap();
        prop_assert_eq!(Document::try_from(expanded.as_ref()).unwrap(), doc);
        prop_assert_eq!(crate::rewrite::expand::raw::needed(raw.as_bytes()), expand::needed(&stored));
    }
}

#[test]
fn raw_expansion_keeps_every_value_type() {
    let mut dict = Dict::default();
    let doc = doc! {
        "a_long_name": {"$numberDecimal": "1"}, "ts": bson::Timestamp { time: 1, increment: 2 },
        "regular": bson::Regex { pattern: "a.b".into(), options: "i".into() },
        "binary_data": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2] },
        "when_it_was": bson::DateTime::from_millis(5), "oid_value": bson::oid::ObjectId::new(),
        "decimal_value": bson::Decimal128::from_bytes([3; 16]), "min": bson::Bson::MinKey, "code": bson::Bson::JavaScriptCode("x".into()),
    };
    let stored = store(&doc, &mut dict);
    let raw = bson::RawDocumentBuf::from_document(&stored).unwrap();
    let expanded = expand::raw_document(&raw, &dict).unwrap();
    assert_eq!(Document::try_from(expanded.as_ref()).unwrap(), doc);
}

#[test]
fn names_inside_error_messages_are_expanded() {
    let mut dict = Dict::default();
    store(
        &doc! {"first_name": 1, "custom": {"Favorite Player": 1}},
        &mut dict,
    );
    let t = |n: &str| dict.token(n).unwrap().as_str().to_owned();
    let text = format!(
        "E11000 duplicate key error collection: app.people index: first_name_1 dup key: {{ {}: \"Jon\", {}.{}: 1 }}",
        t("first_name"),
        t("custom"),
        t("Favorite Player")
    );
    assert_eq!(
        expand::expand_text(&text, &dict),
        "E11000 duplicate key error collection: app.people index: first_name_1 dup key: { first_name: \"Jon\", custom.Favorite Player: 1 }"
    );
    let raw = bson::RawDocumentBuf::from_document(&doc! {"ok": 0.0, "errmsg": text}).unwrap();
    assert!(crate::rewrite::expand::raw::needed(raw.as_bytes()));
}

/// A value printed in an error text cannot close its own quotes: the
/// server prints a quote inside a string as `\"`, and what follows it is
/// still the value's, its control bytes left as they are. A text whose
/// names would take more than the room given is not expanded at all, and
/// a reply holding one is refused within its room, not grown past it.
#[test]
fn an_error_text_is_read_within_its_quotes_and_its_room() {
    let mut dict = Dict::default();
    let long = "n".repeat(1000);
    store(&doc! {"first_name": 1, &long: 1}, &mut dict);
    let t = |n: &str| dict.token(n).unwrap().as_str().to_owned();
    let (first, l) = (t("first_name"), t(&long));
    // The value `x" } { <token>: ` printed by a server that escapes it.
    let text = format!("dup key: {{ {first}: \"x\\\" }} {{ {l}: \" }}");
    assert_eq!(
        expand::expand_text(&text, &dict),
        format!("dup key: {{ first_name: \"x\\\" }} {{ {l}: \" }}")
    );
    // The names of 100 tokens read outside quotes: 100 KB.
    let many = format!("dup key: {{ {} }}", format!("{l}: 1, ").repeat(100));
    let whole = expand::expand_text(&many, &dict);
    assert!(whole.len() > 100_000);
    assert_eq!(
        expand::expand_text_within(&many, &dict, whole.len()),
        Some(whole.clone())
    );
    assert_eq!(
        expand::expand_text_within(&many, &dict, whole.len() - 1),
        None
    );
    let reply =
        bson::RawDocumentBuf::from_document(&doc! {"ok": 0.0, "errmsg": &many, "code": 11000})
            .unwrap();
    let grown = |most: usize| {
        expand::raw_document_within(&reply, &dict, expand::Strings::Data, &mut |n| n.min(most))
    };
    assert!(matches!(grown(64 << 10), Err(expand::Unreadable::Room)));
    let all = grown(1 << 20).unwrap();
    assert_eq!(all.get_str("errmsg").unwrap(), whole);
}

/// A value token in an error text (`BinData(140, <hex>)`, as the server
/// prints a binary; some servers put the hex in quotes) reads as its
/// string, printed as the server prints a string value: in quotes, as it
/// is, cut after 150 bytes when longer.
#[test]
fn an_error_text_prints_a_value_token_as_its_string() {
    let mut dict = Dict::default();
    let long = "é".repeat(80);
    dict.add_values(&[
        "emailAddress".to_owned(),
        "say \"hi\"\n".to_owned(),
        long.clone(),
    ]);
    let expand = |t: &str| expand::expand_text(t, &dict);
    assert_eq!(
        expand("Cannot create field 'address' in element {tags: BinData(140, 00)}"),
        "Cannot create field 'address' in element {tags: \"emailAddress\"}"
    );
    assert_eq!(
        expand("dup key: { tags: BinData(140, 01) }"),
        "dup key: { tags: \"say \"hi\"\n\" }"
    );
    assert_eq!(
        expand("{ tags: BinData(140, 02) }"),
        format!("{{ tags: \"{}...\" }}", "é".repeat(75))
    );
    // The hex in quotes, as SecantusDB's Rust server prints it: the
    // quotes go with the token, and what follows stays as it is.
    assert_eq!(
        expand("Input document: {tags: BinData(140, \"00\")}"),
        "Input document: {tags: \"emailAddress\"}"
    );
    assert_eq!(
        expand("{ tags: BinData(140, \"01\"), a: 1 }"),
        "{ tags: \"say \"hi\"\n\", a: 1 }"
    );
    // Unknown, malformed, or inside a word: left as it is.
    for text in [
        "{a: BinData(140, 03)}",
        "{a: BinData(140, 0)}",
        "{a: BinData(140, zz)}",
        "{a: BinData(140, 00",
        "{a: BinData(140, \"00)}",
        "{a: BinData(140, 00\")}",
        "{a: BinData(140, \"0\")}",
        "{a: BinData(140, \"03\")}",
        "{a: xBinData(140, 00)}",
        "{a: xBinData(140, \"00\")}",
        "{a: BinData(0, 00)}",
    ] {
        assert_eq!(expand(text), text);
    }
    let raw = bson::RawDocumentBuf::from_document(
        &doc! {"ok": 0.0, "errmsg": "in element {tags: BinData(140, 00)}"},
    )
    .unwrap();
    assert!(crate::rewrite::expand::raw::needed(raw.as_bytes()));
}

/// A dictionary of 400 names, one of whose two-byte tokens ends in a quote:
/// that name and its token.
fn quote_ending_token() -> (Dict, String, String) {
    let mut many = Dict::default();
    let names: Vec<String> = (0..400).map(|i| format!("n{i:03}")).collect();
    many.add_names(&names);
    let (name, token) = names
        .iter()
        .find_map(|n| {
            let t = many.token(n)?.as_str().to_owned();
            (t.len() == 2 && t.ends_with('"')).then_some((n.clone(), t))
        })
        .expect("a two-byte token that ends in a quote");
    (many, name, token)
}

/// The target of a `$rename` whose source and target clash is a path the
/// proxy wrote, printed in quotes after the source: each part is read as a
/// path's, its escape byte dropped and its tokens named, where a quoted
/// value elsewhere keeps its escape byte.
#[test]
fn an_error_text_reads_a_clashing_rename_target_as_a_path() {
    let mut dict = Dict::default();
    dict.add_names(&["tab\tname".to_owned(), "level".to_owned()]);
    let tab = dict.token("tab\tname").unwrap().as_str().to_owned();
    let level = dict.token("level").unwrap().as_str().to_owned();
    let expand = |t: &str| expand::expand_text(t, &dict);
    // As SecantusDB's Rust server printed them in the campaign (seeds 4873
    // and 4875): the source as a key, the target as a string.
    assert_eq!(
        expand(&format!(
            "The source and target field for $rename must not be on the same path: \
             \u{1f}\u{1}x: \"\u{1f}\u{1}x.{tab}\""
        )),
        "The source and target field for $rename must not be on the same path: \
         \u{1}x: \"\u{1}x.tab\tname\""
    );
    assert_eq!(
        expand("The source and target field for $rename must differ: \u{1f}\u{2}: \"\u{1f}\u{2}\""),
        "The source and target field for $rename must differ: \u{2}: \"\u{2}\""
    );
    // Behind a server's prefix, and a target of tokens alone.
    assert_eq!(
        expand(&format!(
            "Plan executor error :: caused by :: The source and target field for $rename \
             must differ: {level}: \"{level}.{tab}\" and \"\u{1f}\u{2}\""
        )),
        "Plan executor error :: caused by :: The source and target field for $rename \
         must differ: level: \"level.tab\tname\" and \"\u{1f}\u{2}\""
    );
    // Unclosed, or holding an escaped quote: read as any quoted string.
    for text in [
        "The source and target field for $rename must differ: a: \"\u{1f}\u{2}",
        "The source and target field for $rename must differ: a: \"\u{1f}\u{2}\\\"\"",
    ] {
        assert_eq!(expand(text), text);
    }
    // Elsewhere a quoted string's escape byte stays: it may be a value.
    assert_eq!(
        expand("resulting value was: \"\u{1f}\u{2}\""),
        "resulting value was: \"\u{1f}\u{2}\""
    );
    // A target part that is a token ending in a quote, as a server that
    // prints quotes bare prints it: the token whole, then the closing quote.
    let (many, name, token) = quote_ending_token();
    assert_eq!(
        expand::expand_text(
            &format!(
                "The source and target field for $rename must differ: {token}: \"{token}\" }}"
            ),
            &many
        ),
        format!("The source and target field for $rename must differ: {name}: \"{name}\" }}")
    );
    assert_eq!(
        expand::expand_text(
            &format!("The source and target field for $rename must differ: a: \"{token}.x\""),
            &many
        ),
        format!("The source and target field for $rename must differ: a: \"{name}.x\"")
    );
}

/// A control byte that is the user's own, in an error text, is not read as
/// a token, though its dictionary has one spelled by that byte: the first
/// byte of an escaped key (which was an index's key in a server's error),
/// one inside a key left as it is, and an escape byte inside a key.
#[test]
fn an_error_text_keeps_control_bytes_of_the_users_keys() {
    let mut dict = Dict::default();
    // Fifteen names: every one-byte token is spelled.
    let names: Vec<String> = (0..15).map(|i| format!("name{i:02}")).collect();
    dict.add_names(&names);
    let one_byte = |b: u8| dict.name(&[b]).map(str::to_owned);
    let (b2, b4) = (one_byte(0x02).unwrap(), one_byte(0x04).unwrap());
    let expand = |t: &str| expand::expand_text(t, &dict);
    // Tokens where keys start: at the start, after white space, `{`, `.`,
    // `'`, `$` and `,`.
    assert_eq!(
        expand("\u{2}: { \u{2}.\u{4}: 1 }, '\u{4}' $\u{2},\u{4}"),
        format!("{b2}: {{ {b2}.{b4}: 1 }}, '{b4}' ${b2},{b4}")
    );
    // An escaped key: the escape goes, the byte after it stays.
    assert_eq!(
        expand("key: { sp ace.\u{1f}\u{2}: 1 }"),
        "key: { sp ace.\u{2}: 1 }"
    );
    assert_eq!(expand("\u{1f}\u{4}x.\u{2}"), format!("\u{4}x.{b2}"));
    // Inside a key left as it is: the user's bytes, escape byte included.
    assert_eq!(expand("{ e\u{2}mbedded: 1 }"), "{ e\u{2}mbedded: 1 }");
    assert_eq!(expand("{ a\u{1f}\u{2}: 1 }"), "{ a\u{1f}\u{2}: 1 }");
    assert_eq!(expand("{ \u{1f}\u{2}\u{4}: 1 }"), "{ \u{2}\u{4}: 1 }");
    assert_eq!(expand("名前\u{2}"), "名前\u{2}");
    // In double quotes, a string value: an escape byte there stays (and
    // so does the byte after it), and a token ends before the closing
    // quote. A path the proxy wrote, a `$rename` target, is read.
    assert_eq!(
        expand("in element {tags: \"\u{1f}\u{2}\"} '\u{2}'"),
        format!("in element {{tags: \"\u{1f}\u{2}\"}} '{b2}'")
    );
    assert_eq!(
        expand("{ \u{4}: \"\u{7f}\" }"),
        format!("{{ {b4}: \"\u{7f}\" }}")
    );
    assert_eq!(
        expand("The source and target field for $rename must differ: \u{2}: \"\u{2}.\u{4}\""),
        format!("The source and target field for $rename must differ: {b2}: \"{b2}.{b4}\"")
    );
    // In a printed document and outside one, a quoted string is a value,
    // even one spelling a token (`"\u{2}"`), unless it is a field path.
    assert_eq!(
        expand("in element {b: [ { \u{2}: \"\u{2}\" } ]} and \"\u{2}\""),
        format!("in element {{b: [ {{ {b2}: \"\u{2}\" }} ]}} and \"\u{2}\"")
    );
    assert_eq!(
        expand("{ $concat: [ \"$\u{2}.\u{4}\", \"\u{4}\" ] }"),
        format!("{{ $concat: [ \"${b2}.{b4}\", \"\u{4}\" ] }}")
    );
    // A token whose last byte is a quote, in a path in quotes: read where
    // the rest of the path or the closing quote follows it; a path of its
    // first byte alone stays.
    let (many, name, token) = quote_ending_token();
    let expand = |t: &str| expand::expand_text(t, &many);
    assert_eq!(
        expand(&format!("{{ $concat: [ \"${token}.y\" ] }}")),
        format!("{{ $concat: [ \"${name}.y\" ] }}")
    );
    assert_eq!(
        expand(&format!("{{ $concat: [ \"${token}\" ] }}")),
        format!("{{ $concat: [ \"${name}\" ] }}")
    );
    let first = &token[..1];
    assert_eq!(
        expand(&format!("{{ $concat: [ \"${first}\" ] }}")),
        format!("{{ $concat: [ \"${first}\" ] }}")
    );
    // Nor where a sentence goes on after the closing quote: the quote is
    // not the token's, and the value in the document after it stays too.
    let text = format!(
        "resulting value was: \"{first}\". Type of resulting value: 'string'. \
         Input document: {{price: \"{first}\"}}"
    );
    assert_eq!(expand(&text), text);
    let text = format!("cannot read \"${first}\". Type of it: 'string'");
    assert_eq!(expand(&text), text);
}
