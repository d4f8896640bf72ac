//! One client cannot see or spoil another's work, against an upstream that
//! requires authentication: cursors (held batches included) belong to the
//! user and session that opened them, and a client that has not
//! authenticated, or may not write a database, gives no name a token.

use bson::{doc, Document};
use mongodb::Client;

use crate::common::{self, db_name};

/// The upstream with authentication on, its root URI, and a client on it
/// as root.
async fn secured() -> (String, String, Client) {
    let (host, root) = match common::auth_upstream() {
        Some(up) => (up.host.clone(), format!("{}@", common::ROOT)),
        // An external upstream: its URI carries whatever credentials it needs.
        None => (common::upstream().host.clone(), String::new()),
    };
    let root_uri = format!("mongodb://{root}{host}/?authSource=admin");
    let client = Client::with_uri_str(format!("{root_uri}&directConnection=true"))
        .await
        .unwrap();
    (host, root_uri, client)
}

/// Creates (again) `user` with readWrite on `db` alone.
async fn user(root: &Client, user: &str, db: &str) {
    let admin = root.database("admin");
    let _ = admin.run_command(doc! {"dropUser": user}).await;
    admin
        .run_command(doc! {"createUser": user, "pwd": "pw-of-a-user", "roles": [{"role": "readWrite", "db": db}], "mechanisms": ["SCRAM-SHA-256"]})
        .await
        .unwrap();
}

async fn login(proxy: &laconic::downstream::ProxyHandle, user: &str) -> Client {
    Client::with_uri_str(format!(
        "mongodb://{user}:pw-of-a-user@{}/?authSource=admin&authMechanism=SCRAM-SHA-256&retryWrites=false",
        proxy.addr
    ))
    .await
    .unwrap()
}

fn code(e: &mongodb::error::Error) -> i32 {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => c.code,
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => w.code,
        other => panic!("not a server error: {other:?}"),
    }
}

/// A document whose 80 names are long: expansion makes it about eight
/// times larger than it is stored (3,000 of them pass a reply's 16 MiB).
fn wide(i: i32) -> Document {
    let mut d = doc! {"_id": i};
    for f in 0..80 {
        d.insert(
            format!(
                "a_rather_long_field_name_that_expands_a_lot_when_it_is_read_back_number_{f:02}"
            ),
            i,
        );
    }
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_and_held_batches_belong_to_the_user_and_session_that_opened_them() {
    let (_, root_uri, root) = secured().await;
    let db = db_name("iso", "app");
    root.database(&db).drop().await.unwrap();
    user(&root, "lt_appuser", &db).await;
    user(&root, "lt_eve", &db_name("iso", "eve")).await;
    let mut config = common::proxy_config(&root_uri);
    config.tokenize.min_len = 4;
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let held = || common::metric(proxy.metrics_addr.unwrap(), "laconic_cursor_held_bytes");

    let app = login(&proxy, "lt_appuser").await;
    let c = app.database(&db).collection::<Document>("c");
    let docs: Vec<Document> = (0..3000).map(wide).collect();
    c.insert_many(docs).await.unwrap();

    // The owner opens a cursor in its session; its next batch expands past
    // the reply limit, so the proxy holds the rest.
    let mut session = app.start_session().await.unwrap();
    let first = app
        .database(&db)
        .run_command(doc! {"find": "c", "batchSize": 2, "sort": {"_id": 1}})
        .session(&mut session)
        .await
        .unwrap();
    let id = first.get_document("cursor").unwrap().get_i64("id").unwrap();
    let second = get_more(&app, &db, id, Some(&mut session)).await.unwrap();
    let batch = |d: &Document| {
        d.get_document("cursor")
            .unwrap()
            .get_array("nextBatch")
            .unwrap()
            .len()
    };
    let mut seen = 2 + batch(&second);
    assert!(seen < 3000, "the batch was cut: {seen}");
    assert!(held().await > 0);
    // The upstream cursor is exhausted: the proxy serves the rest under an
    // id of its own.
    let id = second
        .get_document("cursor")
        .unwrap()
        .get_i64("id")
        .unwrap();
    assert_ne!(id, 0);

    // Another user may neither read nor kill it.
    let eve = login(&proxy, "lt_eve").await;
    assert_eq!(code(&get_more(&eve, &db, id, None).await.unwrap_err()), 13);
    let kill = eve
        .database(&db)
        .run_command(doc! {"killCursors": "c", "cursors": [id]})
        .await;
    assert_eq!(code(&kill.unwrap_err()), 13);
    // The same user, outside the cursor's session: the server's error.
    assert_eq!(
        code(&get_more(&app, &db, id, None).await.unwrap_err()),
        50738
    );
    // A connection that has not authenticated gets nothing either.
    let anonymous = Client::with_uri_str(format!("mongodb://{}/?retryWrites=false", proxy.addr))
        .await
        .unwrap();
    assert_eq!(
        code(&get_more(&anonymous, &db, id, None).await.unwrap_err()),
        13
    );

    // The owner's cursor is whole.
    let mut current = id;
    while current != 0 {
        let next = get_more(&app, &db, id, Some(&mut session)).await.unwrap();
        seen += batch(&next);
        current = next.get_document("cursor").unwrap().get_i64("id").unwrap();
        if current != id {
            assert_eq!(current, 0);
        }
    }
    assert_eq!(seen, 3000);
    assert_eq!(held().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_the_right_give_no_name_a_token() {
    let (_, root_uri, root) = secured().await;
    let db = db_name("isonames", "app");
    root.database(&db).drop().await.unwrap();
    user(&root, "lt_writer", &db).await;
    user(&root, "lt_outsider", &db_name("isonames", "other")).await;
    let mut config = common::proxy_config(&root_uri);
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let writer = login(&proxy, "lt_writer").await;
    writer
        .database(&db)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "known_field": 1})
        .await
        .unwrap();
    let names = || async {
        root.database(&db)
            .collection::<Document>("__laconic")
            .count_documents(doc! {})
            .await
            .unwrap()
    };
    let entries = || async {
        let docs = common::by_id(
            &root.database(&db).collection::<Document>("__laconic"),
            doc! {},
        )
        .await;
        docs.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (count, before) = (names().await, entries().await);

    // Not authenticated: the server's own refusal, and no new names.
    let anonymous = Client::with_uri_str(format!("mongodb://{}/?retryWrites=false", proxy.addr))
        .await
        .unwrap();
    let many: Vec<Document> = (0..50)
        .map(|i| doc! {format!("unauthenticated_name_{i}"): 1})
        .collect();
    let err = anonymous
        .database(&db)
        .collection::<Document>("c")
        .insert_many(many)
        .await
        .unwrap_err();
    assert_eq!(code_of_insert(&err), 13, "{err}");
    // Authenticated, but not allowed to write this database: the same.
    let outsider = login(&proxy, "lt_outsider").await;
    let err = outsider
        .database(&db)
        .collection::<Document>("c")
        .insert_one(doc! {"outsider_name": 1})
        .await
        .unwrap_err();
    assert_eq!(code(&err), 13, "{err}");
    assert_eq!((names().await, entries().await), (count, before));
    // The writer's own reads are unaffected.
    let back = common::by_id(&writer.database(&db).collection::<Document>("c"), doc! {}).await;
    assert_eq!(back, vec![doc! {"_id": 1, "known_field": 1}]);
}

async fn get_more(
    client: &Client,
    db: &str,
    id: i64,
    session: Option<&mut mongodb::ClientSession>,
) -> mongodb::error::Result<Document> {
    let cmd = doc! {"getMore": id, "collection": "c"};
    let db = client.database(db);
    match session {
        Some(s) => db.run_command(cmd).session(s).await,
        None => db.run_command(cmd).await,
    }
}

fn code_of_insert(e: &mongodb::error::Error) -> i32 {
    match &*e.kind {
        mongodb::error::ErrorKind::InsertMany(m) => m
            .write_errors
            .as_ref()
            .and_then(|w| w.first().map(|w| w.code))
            .unwrap_or(0),
        _ => code(e),
    }
}

#[tokio::test]
async fn a_client_cannot_forge_a_line_in_the_text_log() {
    use std::io::Read;
    use std::process::Command;

    use laconic::wire::MsgFlags;

    let (mut child, addr) =
        common::serve_process(&["--tokenize-min-len", "4", "--log-format", "text"]);
    let forged = "2020-01-01T00:00:00.000000Z  INFO laconic: shutdown complete";
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Unacknowledged (w:0) commands the proxy refuses, whose names and
    // stages hold a newline: the refusal is logged with the client's text.
    let db = db_name("logforge", "app");
    let name = format!("madeUpCommand\n{forged}");
    common::write_frame(
        &mut s,
        &common::op_msg(
            1,
            MsgFlags::MORE_TO_COME,
            doc! {name: "c", "writeConcern": {"w": 0}, "$db": &db},
        ),
    )
    .await;
    common::write_frame(
        &mut s,
        &common::op_msg(2, MsgFlags::MORE_TO_COME, doc! {"aggregate": "c", "pipeline": [{format!("$stage\n{forged}"): {}}], "cursor": {}, "writeConcern": {"w": 0}, "$db": &db}),
    )
    .await;
    // An acknowledged request after them: they have been handled.
    common::write_frame(
        &mut s,
        &common::op_msg(3, 0, doc! {"ping": 1, "$db": "admin"}),
    )
    .await;
    common::read_frame(&mut s).await.unwrap();
    drop(s);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    assert!(logs.contains("unacknowledged request refused"), "{logs}");
    assert!(
        !logs.lines().any(|l| l.starts_with("2020-01-01")),
        "a forged line:\n{logs}"
    );
}
