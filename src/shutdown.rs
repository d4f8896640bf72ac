//! One shutdown primitive: a cancellation token fanned out to every task, and
//! a tracker that the drain waits on for at most the grace period.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Cloned into the listener and every session.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the shutdown: the listener stops accepting, idle sessions close,
    /// and sessions with a request in flight close once it is answered.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has been triggered (cancellation safe).
    pub async fn triggered(&self) {
        self.token.cancelled().await
    }

    /// The tracker sessions are spawned on.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Waits for every tracked task, at most `grace`; returns whether all finished.
    pub async fn drain(&self, grace: Duration) -> bool {
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
    }
}
