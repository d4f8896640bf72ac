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
use crate::rewrite::walker::Fields;
use crate::token::Migration;
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
    if !matches!(command, "update" | "findAndModify" | "findandmodify") {
        return Ok(());
    }
    // Read from the raw body: only a migrating collection's updates are parsed.
    let body = m.body();
    let (Some(db), Some(coll)) = (body.str_field("$db"), body.first().and_then(|e| e.str())) else {
        return Ok(());
    };
    let Some(migration) = t.policies.migration(db, coll) else {
        return Ok(());
    };
    let filters = filters(ctx, frame, m, db, command).await?;
    let target = Target {
        coll: &ctx.own.database(db).collection(coll),
        store: &t.store,
        db,
        policy: t.policies.get(db, coll),
        reverse: migration == Migration::Reverse,
    };
    for filter in filters {
        let n = convert_matching(&target, filter).await.map_err(|e| ProxyError::Migration {
            network: e.is_network_failure(),
            message: format!(
                "{db}.{coll} is being migrated, and the documents this update matches could not be brought to one form first: {e}"
            ),
        })?;
        debug!(db, coll, documents = n, "converted ahead of an update");
    }
    Ok(())
}

/// The filters of an update of a migrating collection, read from it
/// parsed into documents: on a runtime thread if that holds little
/// ([`INLINE_HOLD`]), as heavy work within its share of the budget
/// otherwise, and refused (146 `ExceededMemoryLimit`) past the whole
/// budget, as its rewrite is.
async fn filters(
    ctx: &Arc<ProxyContext>,
    frame: &Frame,
    m: &OpMsg,
    db: &str,
    command: &str,
) -> Result<Vec<Document>, ProxyError> {
    fn parse(ctx: &ProxyContext, m: &OpMsg, db: &str) -> Result<Vec<Document>, ProxyError> {
        let Some(t) = &ctx.rewrite.tokens else {
            return Ok(Vec::new());
        };
        let cmd = rewrite::Command::from_msg(m)?;
        let names = t.store.dictionary(db)?;
        rewrite::mapper::migration_filters(&cmd, db, &t.policies, &*names)
    }
    let what = || format!("the conversion ahead of this {command}");
    let share = match rewrite::whole_affordable(m, what, INLINE_HOLD) {
        Ok(()) => return parse(ctx, m, db),
        Err(refused) => larger_hold(refused, INLINE_HOLD, ctx.config.max_work_bytes)?,
    };
    let (work, frame, db) = (Arc::clone(ctx), frame.clone(), db.to_owned());
    ctx.heavy
        .run(share, move || match frame.op_msg() {
            Some(m) => parse(&work, m, &db),
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
