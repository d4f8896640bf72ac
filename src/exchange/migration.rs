//! While `laconic migrate` rewrites a collection, an operator or pipeline
//! update could meet a document still in the other form and write beside
//! its fields: the documents its filters match are converted first, the way
//! the migration converts them (one conditional update each), so that the
//! update meets the stored form only.

use bson::Document;
use tracing::{debug, warn};

use crate::context::ProxyContext;
use crate::convert::{ConvertError, Target};
use crate::error::ProxyError;
use crate::rewrite;
use crate::rewrite::walker::Fields;
use crate::token::Migration;
use crate::wire::OpMsg;

pub(super) async fn convert_ahead(
    ctx: &ProxyContext,
    m: &OpMsg,
    command: &str,
) -> Result<(), ProxyError> {
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
    let cmd = rewrite::Command::from_msg(m)?;
    let names = t.store.dictionary(db)?;
    let filters = rewrite::mapper::migration_filters(&cmd, db, &t.policies, &*names)?;
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
