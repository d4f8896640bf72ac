//! Who a session's client is, as far as the dictionaries are concerned.
//!
//! The proxy never authenticates anyone: authentication passes through to
//! the upstream. But it does work on a client's behalf (rewriting, holding
//! batches, giving new names tokens), and that work must not reach further
//! than the server would let the client reach:
//!
//! - when the upstream requires authentication, a session that has not
//!   authenticated gets no rewriting at all: its commands go upstream as
//!   they are, to be refused there with the server's own error;
//! - a write gives new names tokens only if the client's own privileges
//!   (asked with `connectionStatus` on its own upstream connection, once
//!   per authentication) cover the namespace; otherwise it too goes
//!   upstream unchanged, for the server to refuse.

use std::time::{Duration, Instant};

use bson::{doc, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::error::ProxyError;
use crate::upstream::{self, Leg, UpstreamAddr};
use crate::wire::{Frame, Message, MsgFlags, OpMsg};

/// What a session knows of its client.
#[derive(Debug, Default)]
pub struct Auth {
    authenticated: bool,
    privileges: Option<Privileges>,
}

/// The client's rights, as `connectionStatus` gave them.
#[derive(Debug, Default, Clone)]
struct Privileges {
    /// `user@db` of every authenticated user, sorted: who owns the cursors
    /// the client opens.
    users: std::sync::Arc<[String]>,
    /// `(role, db)` of every role the users hold.
    roles: Vec<(String, String)>,
    explicit: Vec<Grant>,
}

/// One explicit privilege: the resource's `(db, collection)` (an empty one
/// for "any"; `None` for a cluster-wide or any-resource privilege) and its
/// actions.
type Grant = (Option<(String, String)>, Vec<String>);

impl Auth {
    /// Whether the client has authenticated on this connection.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Learns from the reply to an authentication command.
    pub fn observe(&mut self, command: &str, reply: &RawDocument) {
        let hello = crate::rewrite::is_hello(command);
        if !hello
            && !matches!(
                command,
                "saslStart" | "saslContinue" | "authenticate" | "logout"
            )
        {
            return;
        }
        let ok = matches!(reply.get("ok"), Ok(Some(RawBsonRef::Double(x))) if x == 1.0)
            || matches!(reply.get("ok"), Ok(Some(RawBsonRef::Int32(1))));
        let done = |d: &RawDocument| d.get_bool("done").unwrap_or(false);
        let became = match command {
            "saslStart" | "saslContinue" => ok && done(reply),
            "authenticate" => ok,
            _ if hello => reply
                .get_document("speculativeAuthenticate")
                .is_ok_and(done),
            "logout" if ok => {
                *self = Auth::default();
                return;
            }
            _ => false,
        };
        if became {
            self.authenticated = true;
            self.privileges = None;
        }
    }

    /// Whether the client may do one of `actions` on `db.coll`: asked of the
    /// upstream on the client's own connection, once per authentication.
    pub async fn may(
        &mut self,
        leg: &mut Leg,
        db: &str,
        coll: &str,
        actions: &[&str],
    ) -> Result<bool, ProxyError> {
        Ok(self
            .privileges(leg)
            .await?
            .is_some_and(|p| p.allow(db, coll, actions)))
    }

    /// The users the client authenticated as (`user@db`, sorted), or `None`
    /// before it authenticates.
    pub async fn users(
        &mut self,
        leg: &mut Leg,
    ) -> Result<Option<std::sync::Arc<[String]>>, ProxyError> {
        Ok(self.privileges(leg).await?.map(|p| p.users.clone()))
    }

    /// The client's privileges: asked of the upstream on the client's own
    /// connection, once per authentication.
    async fn privileges(&mut self, leg: &mut Leg) -> Result<Option<&Privileges>, ProxyError> {
        if !self.authenticated {
            return Ok(None);
        }
        if self.privileges.is_none() {
            let status = leg
                .command(&rawdoc(
                    doc! {"connectionStatus": 1, "showPrivileges": true, "$db": "admin"},
                ))
                .await?;
            self.privileges = Some(Privileges::parse(&status));
        }
        Ok(self.privileges.as_ref())
    }
}

/// Whether a command is part of authenticating (or the handshake, which
/// may carry it): nothing is asked of the upstream on its behalf.
pub fn is_authentication(command: &str) -> bool {
    matches!(
        command,
        "saslStart" | "saslContinue" | "authenticate" | "logout" | "getnonce"
    ) || crate::rewrite::is_hello(command)
}

fn rawdoc(d: bson::Document) -> RawDocumentBuf {
    RawDocumentBuf::from_document(&d).unwrap_or_default()
}

impl Privileges {
    fn parse(status: &RawDocument) -> Privileges {
        let Ok(info) = status.get_document("authInfo") else {
            return Privileges::default();
        };
        let roles = info
            .get_array("authenticatedUserRoles")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|r| {
                let r = r.as_document()?;
                Some((
                    r.get_str("role").ok()?.to_owned(),
                    r.get_str("db").ok()?.to_owned(),
                ))
            })
            .collect();
        let explicit = info
            .get_array("authenticatedUserPrivileges")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|p| {
                let p = p.as_document()?;
                let resource = p.get_document("resource").ok()?;
                let target = match (resource.get_str("db"), resource.get_str("collection")) {
                    (Ok(d), Ok(c)) => Some((d.to_owned(), c.to_owned())),
                    _ => None, // {cluster: true} or {anyResource: true}
                };
                let actions = p
                    .get_array("actions")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect();
                Some((target, actions))
            })
            .collect();
        let mut users: Vec<String> = info
            .get_array("authenticatedUsers")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|u| {
                let u = u.as_document()?;
                Some(format!(
                    "{}@{}",
                    u.get_str("user").ok()?,
                    u.get_str("db").ok()?
                ))
            })
            .collect();
        users.sort();
        Privileges {
            users: users.into(),
            roles,
            explicit,
        }
    }

    fn allow(&self, db: &str, coll: &str, actions: &[&str]) -> bool {
        if !self.explicit.is_empty() {
            return self.explicit.iter().any(|(target, granted)| {
                let covers = match target {
                    None => true,
                    Some((d, c)) => (d.is_empty() || d == db) && (c.is_empty() || c == coll),
                };
                covers && granted.iter().any(|g| actions.contains(&g.as_str()))
            });
        }
        // An upstream that lists roles but not their privileges: the
        // built-in roles' rights.
        let user_db = !matches!(db, "admin" | "local" | "config");
        let admin_only = actions
            .iter()
            .all(|a| matches!(*a, "createIndex" | "collMod" | "createCollection"));
        self.roles.iter().any(|(role, on)| match role.as_str() {
            "root" | "__system" => true,
            "readWriteAnyDatabase" | "restore" => user_db,
            "dbAdminAnyDatabase" => user_db && admin_only,
            "readWrite" | "dbOwner" => on == db,
            "dbAdmin" => on == db && admin_only,
            _ => false,
        })
    }
}

/// Whether the upstream requires authentication: asked once a minute of a
/// connection of the proxy's own that never authenticates.
#[derive(Debug, Default)]
pub struct RequiresAuth(parking_lot::Mutex<Option<(Instant, bool)>>);

impl RequiresAuth {
    pub async fn get(&self, addr: &UpstreamAddr, timeout: Duration) -> bool {
        if let Some((at, known)) = *self.0.lock() {
            if at.elapsed() < Duration::from_secs(60) {
                return known;
            }
        }
        // Unknown (the upstream does not answer): assume it does, so that
        // nothing is done for a client the server might refuse.
        let known = probe(addr, timeout).await.unwrap_or(true);
        *self.0.lock() = Some((Instant::now(), known));
        known
    }
}

async fn probe(addr: &UpstreamAddr, timeout: Duration) -> Option<bool> {
    let mut conn = upstream::connect(addr, timeout, crate::wire::MAX_MESSAGE_SIZE)
        .await
        .ok()?;
    let body = rawdoc(doc! {"listDatabases": 1, "nameOnly": true, "$db": "admin"});
    let frame = Frame::new(
        1,
        0,
        Message::Msg(OpMsg::from_body(MsgFlags::default(), &body)),
    );
    upstream::send(&mut conn, frame).await.ok()?;
    let reply = tokio::time::timeout(timeout, upstream::next_reply(&mut conn))
        .await
        .ok()?
        .ok()?;
    let code = reply.op_msg()?.body().get_i32("code").ok();
    Some(code == Some(13))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privileges(status: bson::Document) -> Privileges {
        Privileges::parse(&rawdoc(status))
    }

    #[test]
    fn explicit_privileges_decide_when_listed() {
        let p = privileges(doc! {"authInfo": {"authenticatedUserPrivileges": [
            {"resource": {"db": "app", "collection": ""}, "actions": ["find", "insert"]},
            {"resource": {"db": "logs", "collection": "events"}, "actions": ["find"]},
        ]}});
        assert!(p.allow("app", "c", &["insert"]));
        assert!(!p.allow("logs", "events", &["insert", "update"]));
        assert!(!p.allow("other", "c", &["insert"]));
    }

    #[test]
    fn built_in_roles_decide_when_privileges_are_not_listed() {
        let writer = privileges(
            doc! {"authInfo": {"authenticatedUserRoles": [{"role": "readWrite", "db": "app"}]}},
        );
        assert!(writer.allow("app", "c", &["insert"]));
        assert!(!writer.allow("other", "c", &["insert"]));
        let reader = privileges(
            doc! {"authInfo": {"authenticatedUserRoles": [{"role": "read", "db": "app"}]}},
        );
        assert!(!reader.allow("app", "c", &["insert", "update"]));
        let admin = privileges(
            doc! {"authInfo": {"authenticatedUserRoles": [{"role": "dbAdmin", "db": "app"}]}},
        );
        assert!(admin.allow("app", "c", &["createIndex"]));
        assert!(!admin.allow("app", "c", &["insert"]));
        let root = privileges(
            doc! {"authInfo": {"authenticatedUserRoles": [{"role": "root", "db": "admin"}]}},
        );
        assert!(root.allow("anything", "c", &["insert"]));
    }

    #[test]
    fn authentication_is_learnt_from_replies() {
        let mut a = Auth::default();
        a.observe("saslStart", &rawdoc(doc! {"ok": 1.0, "done": false}));
        assert!(!a.authenticated());
        a.observe("saslContinue", &rawdoc(doc! {"ok": 1.0, "done": true}));
        assert!(a.authenticated());
        a.observe("logout", &rawdoc(doc! {"ok": 1.0}));
        assert!(!a.authenticated());
        a.observe(
            "hello",
            &rawdoc(doc! {"ok": 1.0, "speculativeAuthenticate": {"done": true}}),
        );
        assert!(a.authenticated());
    }
}
