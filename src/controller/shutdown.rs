//! Shutdown in the order sharding needs: leave the group (the shards move to the other members while this
//! one keeps serving them), then stop the controller. kube ORs its shutdown triggers, so a plain trigger
//! would stop the controller at once and throw the leave away.

use futures::future::{self, BoxFuture};
use futures::FutureExt;
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use crate::group::GroupHandle;

/// Spawn the task that waits for the first trigger (or signal), leaves, waits for the leave to finish (or
/// a second signal), then completes the returned future — the controller's graceful shutdown trigger.
pub(super) fn spawn(
    mut triggers: Vec<BoxFuture<'static, ()>>,
    signals: bool,
    handle: GroupHandle,
    mut done: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    if signals {
        triggers.push(signal().boxed());
    }
    tokio::spawn(async move {
        if triggers.is_empty() {
            // no trigger: never shut down (and keep `stop_tx`, whose drop would stop the controller)
            future::pending::<()>().await;
        }
        future::select_all(triggers).await;
        info!(
            "shutting down: leaving the shard group first (its shards move to the other members)"
        );
        handle.leave();
        let left = done.wait_for(|d| *d);
        if signals {
            tokio::select! {
                biased; // the leave's end first: a signal that races it changes nothing
                _ = left => {}
                () = signal() => warn!("second signal: stopping without waiting for the leave"),
            }
        } else {
            let _ = left.await;
        }
        info!("left the shard group: stopping the controller");
        let _ = stop_tx.send(());
    });
    async move {
        let _ = stop_rx.await;
    }
}

/// Ctrl+C, or SIGTERM on Unix.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    biased; // either signal: same meaning
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                return;
            }
            Err(e) => warn!(error = %e, "cannot listen for SIGTERM: Ctrl+C only"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
