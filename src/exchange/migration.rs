//! While `laconic migrate` rewrites a collection, an operator or pipeline
//! update could meet a document still in the other form and write beside
//! its fields: the documents its filters match are converted first, the way
//! the migration converts them (one conditional update each), so that the
//! update meets the stored form only.

use std::sync::Arc;

use bson::Document;
use tracing::{debug, warn};

use crate::context::ProxyContext;
use crate::convert::{ConvertError, Target};
use crate::error::ProxyError;
use crate::rewrite;
use crate::rewrite::mapper::Converting;
use crate::token::{Migration, Names};
use crate::wire::{Frame, OpMsg};

use super::{larger_hold, INLINE_HOLD};

pub(super) async fn convert_ahead(
    ctx: &Arc<ProxyContext>,
    frame: &Frame,
    command: &str,
) -> Result<(), ProxyError> {
    let Some(m) = frame.op_msg() else {
        return Ok(());
    };
    let Some(t) = &ctx.rewrite.tokens else {
        return Ok(());
    };
    if !matches!(
        command,
        "update" | "findAndModify" | "findandmodify" | "bulkWrite"
    ) {
        return Ok(());
    }
    // Read from the raw body: only a command writing a migrating
    // collection is parsed.
    let migrating = rewrite::written_namespaces(m).iter().any(|ns| {
        ns.split_once('.')
            .is_some_and(|(db, coll)| t.policies.migration(db, coll).is_some())
    });
    if !migrating {
        return Ok(());
    }
    // Boxed: rare, and every update would otherwise carry these futures.
    for Converting { db, coll, filter } in Box::pin(filters(ctx, frame, m, command)).await? {
        let Some(migration) = t.policies.migration(&db, &coll) else {
            continue;
        };
        let target = Target {
            coll: &ctx.own.database(&db).collection(&coll),
            store: &t.store,
            db: &db,
            policy: t.policies.get(&db, &coll),
            reverse: migration == Migration::Reverse,
        };
        let n = Box::pin(convert_matching(&target, filter)).await.map_err(|e| ProxyError::Migration {
            network: e.is_network_failure(),
            message: format!(
                "{db}.{coll} is being migrated, and the documents this {command} matches could not be brought to one form first: {e}"
            ),
        })?;
        debug!(db, coll, documents = n, "converted ahead of an update");
    }
    Ok(())
}

/// The filters of the updates of migrating collections in a command, read
/// from it parsed into documents: on a runtime thread if that holds little
/// ([`INLINE_HOLD`]), as heavy work within its share of the budget
/// otherwise, and refused (146 `ExceededMemoryLimit`) past the whole
/// budget, as its rewrite is.
async fn filters(
    ctx: &Arc<ProxyContext>,
    frame: &Frame,
    m: &OpMsg,
    command: &str,
) -> Result<Vec<Converting>, ProxyError> {
    fn parse(ctx: &ProxyContext, m: &OpMsg) -> Result<Vec<Converting>, ProxyError> {
        let Some(t) = &ctx.rewrite.tokens else {
            return Ok(Vec::new());
        };
        let cmd = rewrite::Command::from_msg(m)?;
        // The dictionaries of the databases with a collection migrating.
        let mut dictionaries = Vec::new();
        for ns in rewrite::written_namespaces(m) {
            if let Some((db, coll)) = ns.split_once('.') {
                let known = dictionaries.iter().any(|(d, _)| d == db);
                if !known && t.policies.migration(db, coll).is_some() {
                    dictionaries.push((db.to_owned(), t.store.dictionary(db)?));
                }
            }
        }
        let names = |db: &str| {
            dictionaries
                .iter()
                .find(|(d, _)| d == db)
                .map(|(_, n)| &**n as &dyn Names)
        };
        rewrite::mapper::migration_filters(&cmd, &t.policies, &names)
    }
    let what = || format!("the conversion ahead of this {command}");
    let share = match rewrite::whole_affordable(m, what, INLINE_HOLD) {
        Ok(()) => return parse(ctx, m),
        Err(refused) => larger_hold(refused, INLINE_HOLD, ctx.config.max_work_bytes)?,
    };
    let (work, frame) = (Arc::clone(ctx), frame.clone());
    ctx.heavy
        .run(share, move || match frame.op_msg() {
            Some(m) => parse(&work, m),
            None => Ok(Vec::new()),
        })
        .await?
}

/// Converts what `filter` matches, once more if a connection failed on
/// the way: every write of a conversion is conditional, so one that
/// stopped halfway is done again safely, and the update is not held back
/// by one lost connection of the proxy's own.
async fn convert_matching(target: &Target<'_>, filter: Document) -> Result<u64, ConvertError> {
    match target.convert_matching(filter.clone()).await {
        Err(e) if e.is_network_failure() => {
            warn!(
                db = target.db,
                "converting ahead of an update: {e}; converting again"
            );
            target.convert_matching(filter).await
        }
        done => done,
    }
}
