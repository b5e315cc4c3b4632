//! The member's tasks for an installed [`TermGate`] (cross-cluster HA is one): admission and fences read
//! the gate live on each use; these tasks keep the member-wide [`Hold::Term`] bit in step (lifting it
//! re-enqueues every owned shard through the unbounded transitions stream) and write the member's
//! drained acknowledgement for a requested drain (HA.md contract 2).

use std::sync::Arc;
use std::time::Duration;

use crate::ownership::inner::Hold;
use crate::ownership::{Ownership, TermGate};

/// Install `gate` in the member's admission and start its two tasks.
pub(super) fn install(
    gate: Arc<dyn TermGate>,
    ownership: &Ownership,
) -> [tokio::task::JoinHandle<()>; 2] {
    ownership.set_hold(Hold::Term, gate.active_epoch().is_none());
    ownership.install_gate(gate.clone());
    [
        tokio::spawn(keep_hold(gate.clone(), ownership.clone())),
        tokio::spawn(ack_drained(gate, ownership.clone())),
    ]
}

/// Keep [`Hold::Term`] set exactly while the gate grants no term: at every change, and at the current
/// term's deadline (a term ends then even if nothing changes).
async fn keep_hold(gate: Arc<dyn TermGate>, own: Ownership) {
    let mut rx = gate.term_changes();
    let mut last = None;
    loop {
        rx.borrow_and_update();
        let active = gate.active_epoch().is_some();
        if last != Some(active) {
            own.set_hold(Hold::Term, !active);
            last = Some(active);
        }
        let remaining = gate.term_remaining();
        if active && !remaining.is_zero() {
            tokio::select! {
                biased; // a change first; either ends the wait
                _ = rx.changed() => {}
                () = tokio::time::sleep(remaining) => {}
            }
        } else if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The member's drained ack (HA.md contract 2): once the gate requests a drain at epoch e, nothing more
/// is admitted under e (the gate grants no term) and its fences end; when every permit and fence the
/// member issued has ended (its reconciles under the old term finished), it records e, and its next
/// member-Lease renewal publishes it. Cleared when the request goes (`demote --cancel`).
async fn ack_drained(gate: Arc<dyn TermGate>, own: Ownership) {
    let mut rx = gate.drain_requests();
    loop {
        let requested = *rx.borrow_and_update();
        match requested {
            None => own.set_gate_drained(None),
            Some(e) => {
                while !own.idle() {
                    tokio::select! {
                        biased; // the stop or a new request first; the poll timer only re-checks idleness
                        r = rx.changed() => if r.is_err() { return } else { break },
                        () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
                if *rx.borrow() == Some(e) && own.idle() {
                    tracing::info!(epoch = %e, "HA: drained for the demotion");
                    own.set_gate_drained(Some(e));
                }
            }
        }
        if rx.has_changed().unwrap_or(false) {
            continue;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
