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

/// The roles of the upstream's hosts.
#[derive(Debug)]
pub struct Topology {
    roles: RwLock<Vec<(Role, Option<Duration>)>>,
    /// Turns mongos hosts take new sessions in.
    turn: AtomicUsize,
    check_now: Notify,
}

impl Topology {
    pub fn new(hosts: usize) -> Topology {
        Topology {
            roles: RwLock::new(vec![(Role::Unknown, None); hosts]),
            turn: AtomicUsize::new(0),
            check_now: Notify::new(),
        }
    }

    /// The order in which a new session tries the hosts (indexes into the
    /// URI's list): the primary, or the healthy mongos hosts starting with
    /// the next in turn, or standalone servers; then hosts not checked yet;
    /// then the rest, so that a session still gets a real error.
    pub fn order(&self) -> Vec<usize> {
        let roles = self.roles.read();
        let n = roles.len();
        let of = |want: &[Role]| -> Vec<usize> {
            (0..n).filter(|&i| want.contains(&roles[i].0)).collect()
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
        let mut order = first;
        order.extend(of(&[Role::Unknown]));
        for i in 0..n {
            if !order.contains(&i) {
                order.push(i);
            }
        }
        order
    }

    /// The roles, as last seen (for `/readyz` and tests).
    pub fn roles(&self) -> Vec<Role> {
        self.roles.read().iter().map(|r| r.0).collect()
    }

    /// Asks for a check now (a host failed, or the primary moved).
    pub fn suspect(&self) {
        self.check_now.notify_one();
    }

    /// Notes that a host could not be connected to.
    pub fn down(&self, host: usize) {
        if let Some(r) = self.roles.write().get_mut(host) {
            r.0 = Role::Down;
        }
        self.suspect();
    }

    /// Sends `hello` to every host and notes what each is.
    pub async fn check(&self, addr: &UpstreamAddr, timeout: Duration) {
        let mut seen = Vec::with_capacity(addr.hosts.len());
        for host in &addr.hosts {
            let started = Instant::now();
            let role = tokio::time::timeout(timeout, hello(addr, host, timeout))
                .await
                .ok()
                .flatten()
                .unwrap_or(Role::Down);
            seen.push((role, Some(started.elapsed())));
        }
        let mut roles = self.roles.write();
        if *roles != seen {
            tracing::info!(hosts = ?addr.hosts, roles = ?seen.iter().map(|r| r.0).collect::<Vec<_>>(), "the upstream's hosts changed roles");
        }
        *roles = seen;
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
    let code = |d: &RawDocument| match d.get("code") {
        Ok(Some(bson::RawBsonRef::Int32(c))) => Some(c),
        Ok(Some(bson::RawBsonRef::Int64(c))) => i32::try_from(c).ok(),
        Ok(Some(bson::RawBsonRef::Double(c))) => Some(c as i32),
        _ => None,
    };
    code(reply).is_some_and(|c| CODES.contains(&c))
        || reply
            .get_document("writeConcernError")
            .ok()
            .and_then(code)
            .is_some_and(|c| CODES.contains(&c))
}

#[cfg(test)]
mod tests {
    use bson::rawdoc;

    use super::*;

    #[test]
    fn sessions_go_to_the_primary_or_in_turn_to_healthy_mongos_hosts() {
        let t = Topology::new(3);
        assert_eq!(t.order(), vec![0, 1, 2], "unchecked: URI order");
        *t.roles.write() = vec![
            (Role::Secondary, None),
            (Role::Primary, None),
            (Role::Down, None),
        ];
        assert_eq!(t.order()[0], 1);
        *t.roles.write() = vec![
            (Role::Mongos, None),
            (Role::Down, None),
            (Role::Mongos, None),
        ];
        let firsts: Vec<usize> = (0..4).map(|_| t.order()[0]).collect();
        assert_eq!(firsts, vec![0, 2, 0, 2]);
        assert_eq!(t.order().last(), Some(&1), "a down host is tried last");
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
    }
}
