//! Names before a request and after its replies: the dictionary a command
//! needs is read, its new names are given tokens (for a client that may
//! write where they go), and a reply holding tokens this proxy has not read
//! yet is expanded again after one more read of the dictionary.

use std::sync::Arc;
use std::time::Instant;

use super::auth::Auth;
use super::INLINE_WORK;
use crate::context::ProxyContext;
use crate::error::ProxyError;
use crate::rewrite::names::Misses;
use crate::rewrite::walker::Fields;
use crate::rewrite::{self, catalogue, LegState, Named, Replied, ReplyPlan};
use crate::token::form::{Conflict, Form, Found};
use crate::token::store::READY_WITHIN;
use crate::token::Integrity;
use crate::upstream::Leg;
use crate::wire::{Frame, Message, OpMsg};

/// Whether a request is rewritten, or goes upstream as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    Rewrite,
    /// The client may not have the proxy work on its behalf (it has not
    /// authenticated, or may not write where the names would go): the
    /// server answers the command as it is.
    PassThrough,
}

/// Before a rewrite: the database's dictionary is read (once), and refused
/// whole if it cannot be trusted; an unauthenticated client of an upstream
/// that requires authentication gets no rewriting.
pub(super) async fn admit(
    ctx: &ProxyContext,
    dbs: &[String],
    auth: &Auth,
) -> Result<Gate, ProxyError> {
    if ctx.rewrite.tokens.is_none() || dbs.is_empty() {
        return Ok(Gate::Rewrite);
    }
    if !auth.authenticated()
        && ctx
            .requires_auth
            .get(&ctx.upstream, ctx.config.connect_timeout())
            .await
    {
        return Ok(Gate::PassThrough);
    }
    sound(ctx, dbs).await?;
    Ok(Gate::Rewrite)
}

/// Every one of `dbs` has a dictionary that may be used: read (once, then
/// within the lease) and checked, or refused whole
/// ([`crate::token::store::NameStore::dictionary`]).
async fn sound(ctx: &ProxyContext, dbs: &[String]) -> Result<(), ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(());
    };
    for db in dbs {
        let mut trips = t.store.ensure_loaded(db).await?.0;
        let mut sound = t.store.dictionary(db).map(|_| ());
        if let Err(Integrity::Unmarked { .. }) = sound {
            trips += Box::pin(t.store.until_marked(db)).await?.0;
            sound = t.store.dictionary(db).map(|_| ());
        }
        if trips > 0 {
            ctx.metrics.store_round_trips(trips);
        }
        sound?;
    }
    Ok(())
}

/// What the proxy knows of migrations, as of now: a command rewritten
/// under it is checked against it before it is sent ([`still_current`]).
pub(super) fn marks(ctx: &ProxyContext) -> u64 {
    ctx.rewrite
        .tokens
        .as_ref()
        .map_or(0, |t| t.policies.migrating.generation())
}

/// Just before a rewritten command is sent: whether what it was rewritten
/// with still stands. Every database it names must have been read within
/// the lease ([`crate::token::store::VIEW_LEASE`]): checked again, and the
/// store read again if need be, when the command took longer than
/// [`READY_WITHIN`] to get ready since `admitted` (allocations and
/// conversions ahead of an update take time). And the migration markers
/// must be those it was rewritten under (`marks`); `false`: they changed,
/// and it must be rewritten again.
pub(super) async fn still_current(
    ctx: &ProxyContext,
    dbs: &[String],
    marks: u64,
    admitted: Instant,
) -> Result<bool, ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(true);
    };
    if admitted.elapsed() >= READY_WITHIN {
        let mut reads = 0;
        while let Some(db) = dbs.iter().find(|db| !t.store.loaded(db)) {
            reads += 1;
            if reads > 3 {
                return Err(stale(dbs));
            }
            let trips = t.store.ensure_loaded(db).await?.0;
            ctx.metrics.store_round_trips(trips);
            t.store.dictionary(db)?;
        }
    }
    Ok(t.policies.migrating.generation() == marks)
}

/// A command that could not be rewritten under a view of the store that
/// held until it was sent.
pub(super) fn stale(dbs: &[String]) -> ProxyError {
    crate::token::StoreError::Stale(dbs.join(", ")).into()
}

/// Before a command that stores documents is forwarded: a tokenized database
/// it writes that has no dictionary yet gets one, tokens needed or not, and
/// a group's member a mark naming the group's dictionary
/// ([`crate::token::store::NameStore::claim`]). `dbs` are the databases
/// its names belong to, claimed if the catalogue says `command` stores
/// documents (asked only where one needs a claim); `into`, those it moves
/// stored documents into besides ([`crate::rewrite::reached`]: an
/// aggregation's `$out`/`$merge` target, its own database included), which
/// it writes whatever the command (a `renameCollection` is no write of the
/// catalogue's). A write to a member is noted ([`crate::token::NameStore::wrote`]).
pub(super) async fn claim(
    ctx: &ProxyContext,
    (dbs, command): (&[String], &str),
    into: &[String],
) -> Result<(), ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(());
    };
    // An aggregation's output is claimed as a database it moves documents
    // into (`into`, its own included); one without an output writes
    // nothing, and gets no dictionary.
    let stores = || {
        catalogue::lookup(command).is_some_and(|e| {
            matches!(
                e.stores,
                catalogue::Stores::Data | catalogue::Stores::Everything
            )
        })
    };
    let named = dbs.iter().map(|db| (db, true));
    for (db, own) in named.chain(into.iter().map(|db| (db, false))) {
        let needed = !t.store.exists(db) || t.store.unmarked(db);
        let member = t.policies.scope_of(db) != db;
        if (needed || member) && (!own || stores()) {
            if needed {
                let trips = Box::pin(t.store.claim(db)).await?.0;
                ctx.metrics.store_round_trips(trips);
            }
            t.store.wrote(db);
        }
    }
    Ok(())
}

/// Before a command that stores documents or names into collections is
/// forwarded: each of them in a tokenized database that has no settings
/// record yet gets one, of this proxy's settings for it
/// ([`crate::token::form`]); another proxy's, recorded first, may say
/// otherwise, and the command is then refused, as [`alike`] refuses.
pub(super) async fn record(ctx: &ProxyContext, named: &Named<'_>) -> Result<(), ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(());
    };
    for &(db, coll) in &named.stored {
        if t.policies.applies_to(db) && !t.policies.forms.has(db, coll) {
            let own = Form::of(t.policies.stored_form(db, coll));
            // Boxed: rare, and its future is large (the driver's), which every
            // command's would carry otherwise.
            let trips = Box::pin(t.store.record_form(db, coll, &own)).await?.0;
            ctx.metrics.store_round_trips(trips);
            if let Some(conflict) = t.policies.conflict(db, coll) {
                return Err(conflict.into());
            }
        }
    }
    Ok(())
}

/// Refuses a command naming a collection whose documents are stored
/// otherwise than this proxy's settings would store them: in a tokenized
/// database, its settings as recorded beside it are not this proxy's; in
/// a database this proxy tokenizes nothing in, the database holds a
/// dictionary (other proxies tokenize it). Rewritten with this proxy's
/// settings, the command would miss documents stored with the others,
/// store documents that queries through other proxies miss, or read names
/// as tokens.
pub(super) async fn alike(ctx: &ProxyContext, named: &Named<'_>) -> Result<(), ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(());
    };
    for &(db, coll) in &named.all {
        if let Some(conflict) = t.policies.conflict(db, coll) {
            return Err(conflict.into());
        }
        if !t.policies.applies_to(db) && !t.policies.excluded(db) && is_database_name(db) {
            // Boxed, as in `record`.
            let (elsewhere, trips) = Box::pin(t.store.tokenized_elsewhere(db)).await?;
            ctx.metrics.store_round_trips(trips.0);
            if elsewhere {
                return Err(Conflict {
                    db: db.to_owned(),
                    coll: coll.to_owned(),
                    found: Found::Dictionary,
                    own: Form::default(),
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Whether MongoDB accepts `db` as a database's name: the server answers a
/// command naming another with its own error.
fn is_database_name(db: &str) -> bool {
    !db.is_empty() && !db.contains(['/', '\\', '.', ' ', '"', '$', '\0'])
}

/// After a successful `drop` of a collection, or a `renameCollection` of
/// one: its settings record goes, so that a collection made again under
/// its name may have other settings.
pub(super) async fn removed(ctx: &ProxyContext, request: &Frame, reply: &Frame) {
    let (Some(t), Some(m), Some(r)) = (&ctx.rewrite.tokens, request.op_msg(), reply.op_msg())
    else {
        return;
    };
    if r.body().field("ok").and_then(|e| e.number()) != Some(1.0) {
        return;
    }
    let body = m.body();
    let gone = match body.first().and_then(|e| Some((e.name()?, e.str()?))) {
        Some(("drop", coll)) => body.str_field("$db").map(|db| (db, coll)),
        Some(("renameCollection", from)) => from.split_once('.'),
        _ => None,
    };
    let Some((db, coll)) = gone.filter(|(db, _)| t.policies.applies_to(db)) else {
        return;
    };
    match Box::pin(t.store.remove_form(db, coll)).await {
        Ok(trips) => ctx.metrics.store_round_trips(trips.0),
        // Left in place, it refuses only a proxy with other settings.
        Err(e) => {
            tracing::warn!(db = ?db, collection = ?coll, "the settings record of a dropped collection was not removed: {e}")
        }
    }
}

/// After a `dropDatabase` (whatever its outcome): the database's dictionary
/// is read again before its next use.
pub(super) fn dropped(ctx: &ProxyContext, request: &Frame) {
    let (Some(t), Some(m)) = (&ctx.rewrite.tokens, request.op_msg()) else {
        return;
    };
    if let Some(db) = m.body().str_field("$db") {
        t.store.suspect(db);
    }
}

/// After a rewrite, what its misses call for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// Nothing: the rewrite stands.
    Done,
    /// Names were given tokens or read: rewrite again.
    Again,
    /// The client may not store these names: the command goes as it is.
    PassThrough,
}

/// Gives the names a command stores tokens (if the client may write where
/// they go), or reads again the dictionaries that lack names it reads
/// (another proxy may have given them tokens since).
pub(super) async fn settle(
    ctx: &ProxyContext,
    misses: &Misses,
    m: &OpMsg,
    command: &str,
    auth: &mut Auth,
    leg: &mut Leg,
    refreshed: &mut bool,
) -> Result<Settled, ProxyError> {
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(Settled::Done);
    };
    let mut trips = 0;
    let outcome = if !misses.stores_nothing() {
        if auth.authenticated() {
            // The client must be allowed the command where its names go.
            let actions = catalogue::lookup(command).map_or(&[][..], |e| e.actions);
            let growing: Vec<String> = misses.to_store().into_iter().map(|(db, ..)| db).collect();
            for ns in rewrite::written_namespaces(m) {
                let (db, coll) = ns.split_once('.').unwrap_or((&ns, ""));
                if growing.iter().any(|g| g == db) && !auth.may(leg, db, coll, actions).await? {
                    return Ok(Settled::PassThrough);
                }
            }
        }
        for (db, names, values) in misses.to_store() {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            trips += Box::pin(t.store.allocate(&db, &names, &values)).await?.0;
        }
        Settled::Again
    } else if !*refreshed && !misses.to_read().is_empty() {
        *refreshed = true;
        let mut grew = false;
        for db in misses.to_read() {
            let before = t.store.dictionary(&db)?;
            trips += Box::pin(t.store.refresh(&db)).await?.0;
            let after = t.store.dictionary(&db)?;
            grew |= before.epoch != after.epoch
                || before.len() != after.len()
                || before.value_count() != after.value_count();
        }
        if grew {
            Settled::Again
        } else {
            Settled::Done
        }
    } else {
        Settled::Done
    };
    ctx.metrics.store_lookup(trips == 0);
    ctx.metrics.store_round_trips(trips);
    Ok(outcome)
}

/// Rewrites a reply; a reply holding tokens this proxy has not read yet
/// (another proxy gave them out since) is expanded again after the
/// dictionary is read once more.
pub(super) async fn expand(
    ctx: &Arc<ProxyContext>,
    reply: Frame,
    plan: &ReplyPlan,
    legs: &mut LegState,
) -> Result<Replied, ProxyError> {
    // A cluster-wide stream's events are read with their databases'
    // dictionaries, which the command did not name: each must pass the
    // checks a read of its database does.
    if let Some(t) = &ctx.rewrite.tokens {
        sound(ctx, &rewrite::event_databases(&reply, plan, &t.policies)?).await?;
    }
    match rewrite_reply(ctx, reply.clone(), plan, legs).await {
        // Tokens the dictionary lacks, or a database with none: another
        // proxy may have added them, or made it, since this one last read.
        Err(ProxyError::Dictionary(
            Integrity::UnknownTokens { scope, .. }
            | Integrity::Older {
                scope, since: None, ..
            },
        )) => {
            if let Some(t) = &ctx.rewrite.tokens {
                Box::pin(t.store.refresh(&scope)).await?;
                if !t.store.exists(&scope) {
                    if let Some(found) = Box::pin(t.store.holding_documents(&scope)).await? {
                        return Err(Integrity::Missing { scope, found }.into());
                    }
                }
            }
            rewrite_reply(ctx, reply, plan, legs).await
        }
        other => other,
    }
}

/// [`rewrite::reply`]; a rewritten command's reply of more than
/// [`INLINE_WORK`] is rewritten as heavy work, off the runtime's threads
/// (expanding 16 MB of tokenized documents takes tens of milliseconds,
/// which every other session on the thread would wait), within the share
/// of the budget for replies that it holds.
///
/// Its expansion grows within a [`rewrite::Room`]: what the proxy can send
/// in one reply and still hold for the cursor's `getMore`, taken from the
/// budget for replies past what the reply's share covers.
async fn rewrite_reply(
    ctx: &Arc<ProxyContext>,
    reply: Frame,
    plan: &ReplyPlan,
    legs: &mut LegState,
) -> Result<Replied, ProxyError> {
    let stored = reply.header.length as usize;
    let held_room = ctx
        .config
        .max_held_bytes
        .saturating_sub(ctx.cursors.held_bytes());
    let room = rewrite::Room::new(
        ctx.replies.clone(),
        stored,
        rewrite::cursor::MAX_REPLY_BODY + held_room,
    );
    match plan {
        ReplyPlan::Rewrite(rules) if stored > INLINE_WORK => {
            let (work, rules) = (Arc::clone(ctx), rules.clone());
            ctx.heavy
                .run_held(move || rewrite::reply_by_rules(reply, &rules, &work.rewrite, room))
                .await?
        }
        _ => rewrite::reply(reply, plan, legs, &ctx.rewrite, room),
    }
}

/// Counts an insert's document bytes as sent and as stored.
pub(super) fn count_documents(ctx: &ProxyContext, original: &Frame, stored: &Frame) {
    let (Message::Msg(m), Some(out)) = (original.message(), stored.op_msg()) else {
        return;
    };
    let body = m.body();
    let (Some(db), Some(coll)) = (body.str_field("$db"), body.first()) else {
        return;
    };
    let ns = format!("{db}.{}", coll.str().unwrap_or_default());
    ctx.metrics.documents(
        &ns,
        "write",
        rewrite::inserted_bytes(m),
        rewrite::inserted_bytes(out),
    );
}
