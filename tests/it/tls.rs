//! TLS on both legs: drivers connect with `tls=true`, the proxy reaches a
//! TLS-only upstream with the URI's own TLS options, certificates rotate
//! under a running proxy, and client certificates are checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use laconic::config::{TlsConfig, TlsMode};
use mongodb::Client;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::io::AsyncReadExt;

use crate::common::{self, db_name};

/// A CA and certificates it signed, as PEM files in one directory.
struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = common::temp_dir(name);
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("laconic test CA {name}"));
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Writes `<name>.pem` and `<name>.key` (and `<name>-both.pem`, the
    /// two in one file, as drivers take a client certificate), for the
    /// names `sans`. Returns the certificate's DER.
    fn issue(&self, name: &str, sans: &[&str]) -> Vec<u8> {
        self.issue_with(name, sans, |_| {})
    }

    /// [`Pki::issue`], with the certificate's parameters changed by `edit`.
    fn issue_with(
        &self,
        name: &str,
        sans: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        edit(&mut params);
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let write = |file: &str, text: &str| {
            // Replaced whole, as a certificate manager does.
            let tmp = self.dir.join(format!("{file}.tmp"));
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, self.dir.join(file)).unwrap();
        };
        write(&format!("{name}.pem"), &cert.pem());
        write(&format!("{name}.key"), &key.serialize_pem());
        write(
            &format!("{name}-both.pem"),
            &format!("{}{}", cert.pem(), key.serialize_pem()),
        );
        cert.der().to_vec()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn driver_tls(pki: &Pki) -> TlsConfig {
    TlsConfig {
        mode: TlsMode::Required,
        cert_file: Some(pki.file("proxy.pem")),
        key_file: Some(pki.file("proxy.key")),
        client_ca_file: None,
    }
}

/// The certificate a TLS handshake with `addr` shows.
async fn presented(addr: std::net::SocketAddr, ca: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

async fn client(uri: String) -> Client {
    Client::with_uri_str(uri).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_both_legs_with_certificates_that_rotate() {
    let pki = Pki::new("tls-both");
    pki.issue("upstream", &["127.0.0.1"]);
    let first = pki.issue("proxy", &["127.0.0.1", "localhost"]);
    let upstream = common::launch(&[
        "--tls",
        s(&pki.file("upstream.pem")),
        s(&pki.file("upstream.key")),
        s(&pki.ca()),
    ]);
    let upstream_uri = format!(
        "mongodb://{}/?tls=true&tlsCAFile={}",
        upstream.host,
        s(&pki.ca())
    );
    let mut config = common::proxy_config(&upstream_uri);
    config.tokenize.min_len = 4;
    config.tls = driver_tls(&pki);
    let proxy = common::start(config).await;

    // A driver with tls=true, through the proxy, to a TLS-only upstream.
    let via = client(format!(
        "mongodb://{}/?tls=true&tlsCAFile={}&retryWrites=false",
        proxy.addr,
        s(&pki.ca())
    ))
    .await;
    let db = db_name("tls", "app");
    let c = via.database(&db).collection::<Document>("c");
    c.drop().await.unwrap();
    c.insert_one(doc! {"_id": 1, "encrypted_field": "x"})
        .await
        .unwrap();
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        vec![doc! {"_id": 1, "encrypted_field": "x"}]
    );
    // Stored tokenized, read directly over TLS.
    let direct = client(format!("{upstream_uri}&directConnection=true")).await;
    let stored: Vec<Document> = common::by_id(&direct.database(&db).collection("c"), doc! {}).await;
    assert!(!stored[0].contains_key("encrypted_field"), "{stored:?}");

    // TLS is required: a plain connection is closed before any reply.
    let mut plain = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    common::write_frame(
        &mut plain,
        &common::op_msg(1, 0, doc! {"hello": 1, "$db": "admin"}),
    )
    .await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(20), plain.read(&mut buf))
        .await
        .expect("closed within 20 s")
        .unwrap_or(0);
    assert_eq!(n, 0, "a plain connection was answered");

    // The certificate rotates: new connections get the new one.
    assert_eq!(presented(proxy.addr, &pki.ca()).await, first);
    let second = pki.issue("proxy", &["127.0.0.1", "localhost"]);
    assert_ne!(first, second);
    let mut seen = Vec::new();
    for _ in 0..50 {
        seen = presented(proxy.addr, &pki.ca()).await;
        if seen == second {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, second, "the rotated certificate was not served");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);

    // The upstream leg checks the name: a URI naming the host otherwise
    // fails; tlsAllowInvalidHostnames is refused (the proxy's own driver
    // connection cannot honour it); tlsInsecure verifies nothing.
    let port = upstream.port();
    let misnamed = format!(
        "mongodb://localhost:{port}/?tls=true&tlsCAFile={}",
        s(&pki.ca())
    );
    let strict = common::start(common::proxy_config(&misnamed)).await;
    let err = client(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=5000",
        strict.addr
    ))
    .await
    .database("admin")
    .run_command(doc! {"ping": 1})
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("certificate") || err.to_string().contains("cannot connect"),
        "{err}"
    );
    let refused = laconic::downstream::Proxy::start(common::proxy_config(&format!(
        "{misnamed}&tlsAllowInvalidHostnames=true"
    )))
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(
        refused.to_string().contains("tlsAllowInvalidHostnames"),
        "{refused}"
    );
    let lenient = common::start(common::proxy_config(&format!(
        "{misnamed}&tlsInsecure=true"
    )))
    .await;
    client(format!("mongodb://{}/", lenient.addr))
        .await
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_mode_serves_both_and_client_certificates_are_checked() {
    let pki = Pki::new("tls-modes");
    pki.issue("proxy", &["127.0.0.1"]);
    pki.issue("app", &["app.client"]);
    let other = Pki::new("tls-modes-other");
    other.issue("stranger", &["stranger.client"]);

    // allowed: plain and TLS drivers alike.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tls = TlsConfig {
        mode: TlsMode::Allowed,
        ..driver_tls(&pki)
    };
    let allowed = common::start(config).await;
    for uri in [
        format!("mongodb://{}/", allowed.addr),
        format!(
            "mongodb://{}/?tls=true&tlsCAFile={}",
            allowed.addr,
            s(&pki.ca())
        ),
    ] {
        client(uri)
            .await
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap();
    }

    // A client CA: a certificate it signed is served, another is not.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tls = TlsConfig {
        client_ca_file: Some(pki.ca()),
        ..driver_tls(&pki)
    };
    let mtls = common::start(config).await;
    let with = |pem: &Path| {
        format!(
            "mongodb://{}/?tls=true&tlsCAFile={}&tlsCertificateKeyFile={}&serverSelectionTimeoutMS=3000",
            mtls.addr,
            s(&pki.ca()),
            s(pem)
        )
    };
    client(with(&pki.file("app-both.pem")))
        .await
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    assert!(client(with(&other.file("stranger-both.pem")))
        .await
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());

    // disabled: a TLS handshake is refused at once, not left to time out.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.handshake_timeout_ms = 60_000;
    let plain = common::start(config).await;
    let mut s = tokio::net::TcpStream::connect(plain.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0])
        .await
        .unwrap();
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
        .await
        .expect("refused well before the 60 s handshake timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

/// The upstream leg refuses a certificate it cannot trust, and says why:
/// one signed by another CA, and one that has expired. Commands that need
/// the upstream fail with a network error naming the certificate; the
/// proxy itself stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_certificates_from_a_wrong_ca_or_expired_are_refused_with_the_reason() {
    let pki = Pki::new("tls-untrusted");
    let other = Pki::new("tls-other-ca");
    pki.issue("upstream", &["127.0.0.1"]);
    pki.issue_with("expired", &["127.0.0.1"], |p| {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    });
    let launch = |name: &str| {
        common::launch(&[
            "--tls",
            s(&pki.file(&format!("{name}.pem"))),
            s(&pki.file(&format!("{name}.key"))),
            s(&pki.ca()),
        ])
    };
    let (good, expired) = (launch("upstream"), launch("expired"));
    let cases = [
        (&good, other.ca(), "invalid peer certificate: UnknownIssuer"),
        (
            &expired,
            pki.ca(),
            "invalid peer certificate: certificate expired",
        ),
    ];
    for (upstream, ca, why) in cases {
        let uri = format!("mongodb://{}/?tls=true&tlsCAFile={}", upstream.host, s(&ca));
        let proxy = common::start(common::proxy_config(&uri)).await;
        let via = client(format!(
            "mongodb://{}/?serverSelectionTimeoutMS=5000&retryReads=false",
            proxy.addr
        ))
        .await;
        let err = via
            .database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(why), "{why}: {text}");
        assert!(
            text.contains("laconic: cannot connect to the upstream"),
            "{text}"
        );
        // Each connection gets its answer at once, and the proxy lives on.
        let mut raw = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        common::write_frame(
            &mut raw,
            &common::op_msg(1, 0, doc! {"hello": 1, "$db": "admin"}),
        )
        .await;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), raw.read_exact(&mut buf))
            .await
            .expect("hello answered, if with an error")
            .unwrap();
    }
}

/// The second driver over TLS: pymongo with `tls=true` through a tokenizing
/// proxy that requires TLS, in front of a TLS-only upstream, runs the
/// whole pymongo scenario (CRUD, cursors over several getMores, an
/// aggregation, a transaction, a change stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_runs_its_scenario_over_tls_on_both_legs() {
    let pki = Pki::new("tls-pymongo");
    pki.issue("upstream", &["127.0.0.1"]);
    pki.issue("proxy", &["127.0.0.1", "localhost"]);
    let upstream = common::launch(&[
        "--tls",
        s(&pki.file("upstream.pem")),
        s(&pki.file("upstream.key")),
        s(&pki.ca()),
    ]);
    let mut config = common::proxy_config(&format!(
        "mongodb://{}/?tls=true&tlsCAFile={}",
        upstream.host,
        s(&pki.ca())
    ));
    config.tokenize.min_len = 4;
    config.tls = driver_tls(&pki);
    let proxy = common::start(config).await;
    let uri = format!(
        "mongodb://{}/?retryWrites=false&tls=true&tlsCAFile={}",
        proxy.addr,
        s(&pki.ca())
    );
    crate::pymongo::session(uri, proxy.addr.to_string(), upstream.host.clone()).await;
}
