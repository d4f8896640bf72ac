//! Which host of the upstream URI a new session goes to, from what a
//! `hello` on a heartbeat says of each (server discovery and monitoring, as
//! drivers do it, reduced to what a proxy needs):
//!
//! - a **replica set**: the writable primary; secondaries are not used (the
//!   proxy presents itself as a mongos, whose reads go to its own choice of
//!   member: here the primary, whatever the driver's `readPreference`);
//! - **mongos hosts**: spread over the healthy ones in turn, skipping one
//!   that is down;
//! - a **single host**: always it, and no heartbeat.
//!
//! A host that fails to connect, or a reply saying the primary moved
//! ([`moved`]), triggers a check at once rather than at the next heartbeat.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, RawDocument};
use parking_lot::RwLock;
use tokio::sync::Notify;

use super::connection::{connect_host, next_reply, send, UpstreamAddr};
use crate::rewrite::walker::{elements, Element, Fields};
use crate::wire::{Frame, Message, MsgFlags, OpMsg};

/// What the last `hello` said of a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not checked yet.
    Unknown,
    /// The writable primary of a replica set.
    Primary,
    /// A replica-set member that takes no writes.
    Secondary,
    Mongos,
    /// A server on its own.
    Standalone,
    /// It did not answer.
    Down,
}

/// One host of the upstream, and what the last `hello` said of it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Host {
    name: String,
    role: Role,
    rtt: Option<Duration>,
}

/// The upstream's hosts (those of its URI, or of its SRV records, which may
/// change) and their roles.
#[derive(Debug)]
pub struct Topology {
    hosts: RwLock<Vec<Host>>,
    /// Turns mongos hosts take new sessions in.
    turn: AtomicUsize,
    check_now: Notify,
}

impl Topology {
    pub fn new(hosts: Vec<String>) -> Topology {
        Topology {
            hosts: RwLock::new(hosts.into_iter().map(Host::unknown).collect()),
            turn: AtomicUsize::new(0),
            check_now: Notify::new(),
        }
    }

    /// The order in which a new session tries the hosts: the primary, or
    /// the healthy mongos hosts starting with the next in turn, or
    /// standalone servers; then hosts not checked yet; then the rest, so
    /// that a session still gets a real error.
    pub fn order(&self) -> Vec<String> {
        let hosts = self.hosts.read();
        let of = |want: &[Role]| -> Vec<&Host> {
            hosts.iter().filter(|h| want.contains(&h.role)).collect()
        };
        let mut first = of(&[Role::Primary]);
        if first.is_empty() {
            let mut serving = of(&[Role::Mongos, Role::Standalone]);
            if !serving.is_empty() {
                let k = self.turn.fetch_add(1, Ordering::Relaxed) % serving.len();
                serving.rotate_left(k);
            }
            first = serving;
        }
        let mut order: Vec<String> = first.into_iter().map(|h| h.name.clone()).collect();
        order.extend(of(&[Role::Unknown]).into_iter().map(|h| h.name.clone()));
        for h in hosts.iter() {
            if !order.contains(&h.name) {
                order.push(h.name.clone());
            }
        }
        order
    }

    /// The hosts, in the order they were given.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.read().iter().map(|h| h.name.clone()).collect()
    }

    /// The roles, as last seen (for `/readyz` and tests).
    pub fn roles(&self) -> Vec<Role> {
        self.hosts.read().iter().map(|h| h.role).collect()
    }

    /// Whether there is one host alone.
    pub fn is_single(&self) -> bool {
        self.hosts.read().len() == 1
    }

    /// Replaces the hosts (the SRV records changed); those kept keep their
    /// roles, new ones are checked at once.
    pub fn set_hosts(&self, names: Vec<String>) {
        let mut hosts = self.hosts.write();
        if hosts.iter().map(|h| &h.name).eq(names.iter()) {
            return;
        }
        tracing::info!(was = ?hosts.iter().map(|h| &h.name).collect::<Vec<_>>(), now = ?names, "the upstream's hosts changed");
        *hosts = names
            .into_iter()
            .map(|n| match hosts.iter().find(|h| h.name == n) {
                Some(h) => h.clone(),
                None => Host::unknown(n),
            })
            .collect();
        drop(hosts);
        self.suspect();
    }

    /// Asks for a check now (a host failed, or the primary moved).
    pub fn suspect(&self) {
        self.check_now.notify_one();
    }

    /// Notes that a host could not be connected to.
    pub fn down(&self, host: &str) {
        if let Some(h) = self.hosts.write().iter_mut().find(|h| h.name == host) {
            h.role = Role::Down;
        }
        self.suspect();
    }

    /// Sends `hello` to every host and notes what each is.
    pub async fn check(&self, addr: &UpstreamAddr, timeout: Duration) {
        let names = self.hosts();
        let mut seen = Vec::with_capacity(names.len());
        for name in names {
            let started = Instant::now();
            let role = tokio::time::timeout(timeout, hello(addr, &name, timeout))
                .await
                .ok()
                .flatten()
                .unwrap_or(Role::Down);
            seen.push(Host {
                name,
                role,
                rtt: Some(started.elapsed()),
            });
        }
        let mut hosts = self.hosts.write();
        for h in hosts.iter_mut() {
            // A host the SRV records dropped meanwhile is not brought back.
            if let Some(s) = seen.iter().find(|s| s.name == h.name) {
                if s.role != h.role {
                    tracing::info!(host = h.name, was = ?h.role, now = ?s.role, "an upstream host changed role");
                }
                *h = s.clone();
            }
        }
    }

    /// Checks every `every`, or at once when asked, until `shutdown`.
    pub async fn monitor(
        self: Arc<Self>,
        addr: UpstreamAddr,
        every: Duration,
        timeout: Duration,
        shutdown: crate::shutdown::Shutdown,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.triggered() => return,
                _ = self.check_now.notified() => {}
                _ = tokio::time::sleep(every) => {}
            }
            self.check(&addr, timeout).await;
        }
    }
}

impl Host {
    fn unknown(name: String) -> Host {
        Host {
            name,
            role: Role::Unknown,
            rtt: None,
        }
    }
}

/// One `hello` on a connection of its own: the host's role.
async fn hello(addr: &UpstreamAddr, host: &str, timeout: Duration) -> Option<Role> {
    let mut conn = connect_host(addr, host, timeout, crate::wire::MAX_MESSAGE_SIZE)
        .await
        .ok()?;
    let body = bson::RawDocumentBuf::from_document(&doc! {"hello": 1, "$db": "admin"}).ok()?;
    let frame = Frame::new(
        1,
        0,
        Message::Msg(OpMsg::from_body(MsgFlags::default(), &body)),
    );
    send(&mut conn, frame).await.ok()?;
    let reply = next_reply(&mut conn).await.ok()?;
    Some(role_of(reply.op_msg()?.body()))
}

fn role_of(hello: &RawDocument) -> Role {
    let yes = |k| hello.get_bool(k).unwrap_or(false);
    if hello.get_str("msg") == Ok("isdbgrid") {
        Role::Mongos
    } else if yes("isWritablePrimary") || yes("ismaster") {
        if hello.get_str("setName").is_ok() {
            Role::Primary
        } else {
            Role::Standalone
        }
    } else {
        Role::Secondary
    }
}

/// Whether a reply says the session's server is no longer the primary (or
/// is shutting down): its upstream connection is then of no more use.
pub fn moved(reply: &RawDocument) -> bool {
    const CODES: &[i32] = &[
        10107, // NotWritablePrimary
        13435, // NotPrimaryNoSecondaryOk
        13436, // NotPrimaryOrSecondary
        11600, // InterruptedAtShutdown
        11602, // InterruptedDueToReplStateChange
        189,   // PrimarySteppedDown
        91,    // ShutdownInProgress
        10058, // LegacyNotPrimary
    ];
    let listed = |e: Element<'_>| {
        e.number()
            .is_some_and(|c| CODES.iter().any(|&k| f64::from(k) == c.trunc()))
    };
    // One pass over the reply (every reply is read so): its own code, or
    // its write concern error's.
    elements(reply.as_bytes())
        .map_while(Result::ok)
        .any(|e| match e.key {
            b"code" => listed(e),
            b"writeConcernError" => e
                .document()
                .and_then(|d| d.field("code"))
                .is_some_and(listed),
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use super::*;

    #[test]
    fn sessions_go_to_the_primary_or_in_turn_to_healthy_mongos_hosts() {
        let t = Topology::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(t.order(), vec!["a", "b", "c"], "unchecked: URI order");
        let set = |roles: [Role; 3]| {
            for (h, r) in t.hosts.write().iter_mut().zip(roles) {
                h.role = r;
            }
        };
        set([Role::Secondary, Role::Primary, Role::Down]);
        assert_eq!(t.order()[0], "b");
        set([Role::Mongos, Role::Down, Role::Mongos]);
        let firsts: Vec<String> = (0..4).map(|_| t.order()[0].clone()).collect();
        assert_eq!(firsts, vec!["a", "c", "a", "c"]);
        assert_eq!(t.order().last().unwrap(), "b", "a down host is tried last");
    }

    #[test]
    fn new_hosts_are_unknown_and_kept_ones_keep_their_role() {
        let t = Topology::new(vec!["a".into(), "b".into()]);
        t.down("b");
        t.hosts.write()[0].role = Role::Mongos;
        t.set_hosts(vec!["b".into(), "c".into()]);
        assert_eq!(t.hosts(), vec!["b", "c"]);
        assert_eq!(t.roles(), vec![Role::Down, Role::Unknown]);
        assert_eq!(t.order(), vec!["c", "b"], "unchecked before down");
    }

    #[test]
    fn hello_replies_and_moved_primaries_are_read() {
        assert_eq!(role_of(&rawdoc! {"msg": "isdbgrid"}), Role::Mongos);
        assert_eq!(
            role_of(&rawdoc! {"isWritablePrimary": true, "setName": "rs"}),
            Role::Primary
        );
        assert_eq!(
            role_of(&rawdoc! {"isWritablePrimary": true}),
            Role::Standalone
        );
        assert_eq!(
            role_of(&rawdoc! {"isWritablePrimary": false, "secondary": true, "setName": "rs"}),
            Role::Secondary
        );
        assert!(moved(&rawdoc! {"ok": 0.0, "code": 10107}));
        assert!(moved(
            &rawdoc! {"ok": 1.0, "writeConcernError": {"code": 189}}
        ));
        assert!(!moved(&rawdoc! {"ok": 0.0, "code": 11000}));
        // Either one, in either order, past fields of any kind.
        assert!(moved(
            &rawdoc! {"cursor": {"code": 1}, "code": 64, "writeConcernError": {"code": 91}}
        ));
        assert!(moved(
            &rawdoc! {"writeConcernError": {"code": 64}, "code": 13435, "ok": 0.0}
        ));
        assert!(!moved(
            &rawdoc! {"ok": 1.0, "cursor": {"code": 10107}, "writeConcernError": {"errmsg": "x"}}
        ));
    }
}
