//! Planted bugs (feature `planted-bugs`, never on by default): switches the fault simulator (`chaos/`) and
//! the models (`tests/it/model_handoff.rs`, `tests/it/model_takeover.rs`) turn on, one at a time, to show
//! that their oracles catch each bug. Every switch is per thread (a simulated
//! seed runs on one thread), and off until [`set`] turns it on.

use std::cell::Cell;

/// A bug that can be planted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A drain releases a shard at once, without waiting for its admitted work and fences.
    SkipDrainWait,
    /// A shard granted to the read path is activated without the barrier (no consistent read first).
    SkipActivationBarrier,
    /// The coordinator treats an owner it has not observed as gone.
    UnobservedIsGone,
    /// A member follows an assignment whose epoch for a shard is lower than the one it holds.
    AcceptLowerEpoch,
    /// A shard forgets the gate a re-grant, cancel-back or release retires: a later drain waits only for
    /// the current gate, not for requests still in flight under the retired one.
    ForgetRetiredGates,
    /// The coordinator ignores `kept` reports: it grants a shard another live member holds at a higher epoch
    /// (after a rolled-back assignment) without first naming that holder.
    GrantOverKeptHolder,
    /// A member activates a grant at or below a generation it applied before that view (a grant only a
    /// rolled-back assignment can make), instead of reporting it `stale`.
    ActivateRolledBackGrant,
}

impl Bug {
    /// Every bug, with its name (`--plant NAME`).
    pub const ALL: [(&'static str, Bug); 7] = [
        ("skip-drain-wait", Bug::SkipDrainWait),
        ("skip-activation-barrier", Bug::SkipActivationBarrier),
        ("unobserved-is-gone", Bug::UnobservedIsGone),
        ("accept-lower-epoch", Bug::AcceptLowerEpoch),
        ("forget-retired-gates", Bug::ForgetRetiredGates),
        ("grant-over-kept-holder", Bug::GrantOverKeptHolder),
        ("activate-rolled-back-grant", Bug::ActivateRolledBackGrant),
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

thread_local! {
    static ON: Cell<u8> = const { Cell::new(0) };
}

/// Switch `bug` on or off on the calling thread.
pub fn set(bug: Bug, on: bool) {
    ON.with(|c| {
        let v = if on {
            c.get() | bug.bit()
        } else {
            c.get() & !bug.bit()
        };
        c.set(v);
    });
}

/// Whether `bug` is on for the calling thread.
#[must_use]
pub fn on(bug: Bug) -> bool {
    ON.with(|c| c.get() & bug.bit() != 0)
}
