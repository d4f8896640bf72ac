//! Shared fixtures: the upstream, a proxy in front of it, drivers, raw frames.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use parking_lot::Mutex;

use bson::{doc, Document, RawDocumentBuf};
use bytes::Bytes;
use laconic::config::ProxyConfig;
use laconic::downstream::{Proxy, ProxyHandle};
use laconic::wire::{Frame, Message, MsgFlags, OpMsg, MAX_MESSAGE_SIZE};
use mongodb::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upstream for the tests: a URI, and the process behind it if we started it.
pub struct Upstream {
    /// `mongodb://host:port/` with no options.
    pub uri: String,
    pub host: String,
    /// Keeps the launcher's stdin open; the launcher stops the server at EOF.
    _process: Option<Mutex<Child>>,
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of the project's venv (installed by scripts/setup.sh).
pub fn venv_python() -> PathBuf {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    READY
        .get_or_init(|| {
            let python = root().join(".upstream/venv/bin/python");
            let status = Command::new("bash")
                .arg(root().join("scripts/setup.sh"))
                .status()
                .expect("run scripts/setup.sh");
            assert!(status.success(), "scripts/setup.sh failed");
            python
        })
        .clone()
}

/// A SecantusDB of the test's own (with the launcher's options), stopped
/// when the returned value is dropped or [`Upstream::stop`]ped.
pub fn launch(extra: &[&str]) -> Upstream {
    let mut child = Command::new(venv_python())
        .arg(root().join("scripts/upstream.py"))
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start scripts/upstream.py");
    let stdout = child.stdout.take().expect("launcher stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read launcher output");
    let port: u16 = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("upstream launcher said {line:?}"));
    let host = format!("127.0.0.1:{port}");
    Upstream {
        uri: format!("mongodb://{host}/"),
        host,
        _process: Some(Mutex::new(child)),
    }
}

impl Upstream {
    /// Stops the server (the launcher stops it when its stdin closes) and
    /// waits for it to exit.
    pub fn stop(&self) {
        if let Some(p) = &self._process {
            let mut child = p.lock();
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it.
    pub fn kill(&self) {
        if let Some(p) = &self._process {
            let mut child = p.lock();
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                let _ = stdin.write_all(b"kill\n");
            }
            let _ = child.wait();
        }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.host.rsplit_once(':').unwrap().1.parse().unwrap()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The upstream shared by every test in this binary: `LACONIC_TEST_UPSTREAM`
/// when set (a real mongod, say), otherwise a SecantusDB started here.
pub fn upstream() -> &'static Upstream {
    static UPSTREAM: OnceLock<Upstream> = OnceLock::new();
    UPSTREAM.get_or_init(|| match std::env::var("LACONIC_TEST_UPSTREAM") {
        Ok(uri) if !uri.is_empty() => {
            let c =
                laconic::config::uri::ConnectionString::parse(&uri).expect("LACONIC_TEST_UPSTREAM");
            Upstream {
                host: c.hosts.first().expect("a mongodb:// URI").clone(),
                uri,
                _process: None,
            }
        }
        _ => launch(&[]),
    })
}

/// The root user of [`auth_upstream`], as `user:password`.
pub const ROOT: &str = "laconic:s3cret-pw";

/// A driver authenticated as [`ROOT`] at `addr` (the auth upstream itself,
/// or a proxy in front of it), with `options` after `authSource=admin`.
pub async fn as_root(addr: impl std::fmt::Display, options: &str) -> Client {
    Client::with_uri_str(format!(
        "mongodb://{ROOT}@{addr}/?authSource=admin&{options}"
    ))
    .await
    .expect("client")
}

/// A second SecantusDB with SCRAM-SHA-256 on and one root user; `None` when
/// the tests run against an external upstream (which the test then uses).
pub fn auth_upstream() -> Option<&'static Upstream> {
    static UPSTREAM: OnceLock<Option<Upstream>> = OnceLock::new();
    UPSTREAM
        .get_or_init(|| {
            if std::env::var("LACONIC_TEST_UPSTREAM").is_ok_and(|u| !u.is_empty()) {
                None
            } else {
                Some(launch(&["--auth", ROOT]))
            }
        })
        .as_ref()
}

/// A second, separate SecantusDB: the untokenized deployment of shadow
/// mode. Started here in every case (the launcher is always installed).
pub fn second_upstream() -> &'static Upstream {
    static UPSTREAM: OnceLock<Upstream> = OnceLock::new();
    UPSTREAM.get_or_init(|| launch(&[]))
}

pub fn proxy_config(upstream: &str) -> ProxyConfig {
    ProxyConfig {
        listen: "127.0.0.1:0".into(),
        upstream: upstream.to_owned(),
        ..ProxyConfig::default()
    }
}

/// A proxy in front of the shared upstream, running on the test's runtime.
pub async fn proxy() -> ProxyHandle {
    start(proxy_config(&upstream().uri)).await
}

pub async fn start(config: ProxyConfig) -> ProxyHandle {
    Proxy::start(config).await.expect("start proxy")
}

/// Pooled connections idle longer than this are closed by the driver: the
/// upstream used here closes connections idle for 300 s, and a slow test on
/// a busy machine would otherwise meet one it closed (as with any server or
/// load balancer that has an idle timeout).
const MAX_IDLE: &str = "maxIdleTimeMS=120000";

/// A driver pointed at the proxy exactly as a user would: the address only,
/// no `directConnection`.
pub async fn via_proxy(proxy: &ProxyHandle) -> Client {
    Client::with_uri_str(format!(
        "mongodb://{}/?retryWrites=false&{MAX_IDLE}",
        proxy.addr
    ))
    .await
    .expect("client")
}

/// A driver connected straight to the upstream.
pub async fn direct() -> Client {
    let uri = &upstream().uri;
    let sep = if uri.contains('?') { "&" } else { "?" };
    let uri = if uri.ends_with('/') || uri.contains('?') {
        format!("{uri}{sep}directConnection=true&retryWrites=false&{MAX_IDLE}")
    } else {
        format!("{uri}/?directConnection=true&retryWrites=false&{MAX_IDLE}")
    };
    Client::with_uri_str(uri).await.expect("client")
}

/// A database name unique to one test and one side of a comparison.
pub fn db_name(test: &str, side: &str) -> String {
    format!("lt_{test}_{side}")
}

/// Collection `c` of test `test`'s database through `client`, emptied.
pub async fn empty_collection(
    client: &mongodb::Client,
    test: &str,
) -> mongodb::Collection<Document> {
    let c = client
        .database(&db_name(test, "app"))
        .collection::<Document>("c");
    c.drop().await.unwrap();
    c
}

// --- raw frames -----------------------------------------------------------

pub fn op_msg(request_id: i32, flags: u32, body: Document) -> Frame {
    let raw = RawDocumentBuf::from_document(&body).unwrap();
    let mut m = OpMsg::from_body(MsgFlags::default(), &raw);
    m.flags = MsgFlags(flags);
    Frame::new(request_id, 0, Message::Msg(m))
}

pub async fn write_frame(stream: &mut TcpStream, frame: &Frame) {
    stream.write_all(&frame.to_bytes()).await.unwrap();
}

/// Reads one frame; `None` when the peer closed the connection.
pub async fn read_frame(stream: &mut TcpStream) -> Option<Frame> {
    let mut len = [0u8; 4];
    if stream.read_exact(&mut len).await.is_err() {
        return None;
    }
    let n = i32::from_le_bytes(len) as usize;
    let mut buf = vec![0u8; n];
    buf[..4].copy_from_slice(&len);
    stream.read_exact(&mut buf[4..]).await.ok()?;
    Some(Frame::parse(Bytes::from(buf), MAX_MESSAGE_SIZE).expect("valid frame"))
}

pub fn body(frame: &Frame) -> Document {
    let raw = match frame.message() {
        Message::Msg(m) => m.body(),
        Message::Reply(r) => r.first().unwrap(),
        other => panic!("unexpected message {other:?}"),
    };
    Document::try_from(raw).unwrap()
}

/// A raw connection to the proxy that has completed a `hello`.
pub async fn raw_session(proxy: &ProxyHandle) -> TcpStream {
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    write_frame(&mut s, &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"})).await;
    let reply = read_frame(&mut s).await.expect("hello reply");
    assert_eq!(body(&reply).get_str("msg").unwrap(), "isdbgrid");
    s
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laconic-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// A byte-for-byte TCP relay in front of `target` that notes the opcode
/// and the bytes of every message sent towards the target: it shows what
/// the proxy's upstream leg (or its name store's client) really carries.
pub struct Tap {
    pub addr: std::net::SocketAddr,
    /// Each message after its length word.
    messages: std::sync::Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Tap {
    /// The opcode of every message seen, in order.
    pub fn opcodes(&self) -> Vec<i32> {
        self.messages
            .lock()
            .iter()
            .map(|rest| i32::from_le_bytes(rest[8..12].try_into().unwrap()))
            .collect()
    }

    /// The command document (the kind-0 section) of every OP_MSG seen.
    pub fn commands(&self) -> Vec<Document> {
        self.messages
            .lock()
            .iter()
            .filter(|rest| rest[8..12] == 2013i32.to_le_bytes() && rest.get(16) == Some(&0))
            .map(|rest| {
                let len = i32::from_le_bytes(rest[17..21].try_into().unwrap()) as usize;
                bson::from_slice(&rest[17..17 + len]).expect("an OP_MSG body")
            })
            .collect()
    }
}

pub async fn tap(target: String) -> Tap {
    use std::sync::Arc;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let messages = Arc::new(Mutex::new(Vec::new()));
    let kept = messages.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let up = TcpStream::connect(&target).await.unwrap();
            let (mut dr, mut dw) = down.into_split();
            let (mut ur, mut uw) = up.into_split();
            let kept = kept.clone();
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if dr.read_exact(&mut len).await.is_err() {
                        break;
                    }
                    let mut rest = vec![0u8; i32::from_le_bytes(len) as usize - 4];
                    if dr.read_exact(&mut rest).await.is_err() {
                        break;
                    }
                    kept.lock().push(rest.clone());
                    if uw.write_all(&len).await.is_err() || uw.write_all(&rest).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut ur, &mut dw).await;
            });
        }
    });
    Tap { addr, messages }
}

/// Every document matching `filter`, in `_id` order (as documents, or as
/// raw bytes with a `Collection<RawDocumentBuf>`).
pub async fn by_id<T>(c: &mongodb::Collection<T>, filter: Document) -> Vec<T>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    use futures::TryStreamExt;
    c.find(filter)
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// [`by_id`], with the error instead of a panic.
pub async fn by_id_checked<T>(
    c: &mongodb::Collection<T>,
    filter: Document,
) -> mongodb::error::Result<Vec<T>>
where
    T: serde::de::DeserializeOwned + Send + Sync,
{
    use futures::TryStreamExt;
    c.find(filter)
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await
}

/// A collection's index specs as listIndexes gives them (read one per batch,
/// so getMore is exercised), by name, without `ns`, which names the database.
pub async fn index_specs(db: &mongodb::Database, coll: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    let mut specs: Vec<Document> = db
        .run_cursor_command(doc! {"listIndexes": coll, "cursor": {"batchSize": 1}})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    for s in &mut specs {
        s.remove("ns");
    }
    specs.sort_by_key(|s| s.get_str("name").unwrap_or_default().to_owned());
    specs
}

/// A dropped, empty collection `c` in the database for `test`/`side`.
pub async fn fresh(client: &Client, test: &str, side: &str) -> mongodb::Collection<Document> {
    let d = client.database(&db_name(test, side));
    d.drop().await.unwrap();
    d.collection("c")
}

/// What the upstream holds in `db.coll`, read directly, in `_id` order.
pub async fn stored(db: &str, coll: &str) -> Vec<Document> {
    by_id(&direct().await.database(db).collection(coll), doc! {}).await
}

/// Runs a command of the `laconic` binary to its end (off the async
/// workers), asserts that it succeeded, and returns its standard output.
/// A failure shows both outputs: a script says on its standard output
/// what differed.
pub async fn run_ok(mut command: std::process::Command) -> String {
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `GET path` on the metrics port: (status code, body).
pub async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the unlabelled series `name` on the metrics port (0 when
/// it is missing).
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> u64 {
    let (_, text) = get(addr, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// `laconic serve` as a process, on a free port, with `args` after the
/// upstream: the child (stdout and stderr piped) and the address it printed.
pub fn serve_process(args: &[&str]) -> (std::process::Child, String) {
    serve_process_at(&upstream().uri, args)
}

/// [`serve_process`] in front of the upstream at `uri`.
pub fn serve_process_at(uri: &str, args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_laconic"))
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", uri])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the listening line")
        .to_owned();
    (child, addr)
}

/// The cluster time just after a session's last operation. A change stream
/// opened without a start point starts at the upstream's visible tail, which
/// another test's write still in flight holds back behind writes already
/// acknowledged; a stream started here sees what comes after that operation
/// and nothing before it.
pub fn just_after(session: &mongodb::ClientSession) -> bson::Timestamp {
    let t = session
        .operation_time()
        .expect("the session has seen an operation time");
    bson::Timestamp {
        time: t.time,
        increment: t.increment + 1,
    }
}

/// The command error a driver call failed with (any other kind fails the test).
pub fn command_error(err: mongodb::error::Error) -> mongodb::error::CommandError {
    match *err.kind {
        mongodb::error::ErrorKind::Command(e) => e,
        other => panic!("not a command error: {other:?}"),
    }
}
