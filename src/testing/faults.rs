//! Fault injection, the one mechanism every crate of the workspace uses to show that a checker catches the
//! bug it exists for: a [`Fault`] names a rule deliberately broken, and the code that keeps the rule asks
//! whether the fault is planted before it does.
//!
//! Each crate declares its own fault points (`Fault::new`) and lists them (the core's are in [`CORE`]). A
//! fault is planted either for the calling thread ([`plant`]; a simulated run or a paused-time test runs on
//! one thread) or for one instance that carries a [`Faults`] set (an HA elector among several in one test).
//! Without the `test-util` feature no fault point is compiled in.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fault point: a rule the code keeps unless this fault is planted. Its name is what `--plant NAME` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fault(&'static str);

impl Fault {
    /// A fault point named `name` (kebab-case, unique across the workspace: prefix it with the crate's
    /// concept, as `ha-` for the HA crate).
    #[must_use]
    pub const fn new(name: &'static str) -> Self {
        Fault(name)
    }

    /// Its name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.0
    }
}

/// A set of planted faults, for an instance that carries its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults(BTreeSet<Fault>);

impl Faults {
    /// No fault planted.
    #[must_use]
    pub fn none() -> Self {
        Faults::default()
    }

    /// This set with `fault` planted.
    #[must_use]
    pub fn with(mut self, fault: Fault) -> Self {
        self.0.insert(fault);
        self
    }

    /// Whether `fault` is planted in this set.
    #[must_use]
    pub fn on(&self, fault: Fault) -> bool {
        self.0.contains(&fault)
    }

    /// Whether no fault is planted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

thread_local! {
    static PLANTED: RefCell<Faults> = RefCell::new(Faults::none());
}

/// Faults planted on any thread, so [`on`] costs one atomic load while none is: fault points sit on hot
/// paths (every assignment applied, every drain), and builds with `test-util` (the CLI's demo) run them. A
/// thread that ends with faults planted leaves the count up, which only costs the fast path.
static PLANTED_ANYWHERE: AtomicUsize = AtomicUsize::new(0);

/// Plant `fault` on the calling thread until the returned guard is dropped.
#[must_use = "the fault is lifted when the guard is dropped"]
pub fn plant(fault: Fault) -> Planted {
    set(fault, true);
    Planted(fault)
}

/// Plant (`true`) or lift (`false`) `fault` on the calling thread.
pub fn set(fault: Fault, planted: bool) {
    PLANTED.with(|p| {
        let mut p = p.borrow_mut();
        if planted {
            if p.0.insert(fault) {
                PLANTED_ANYWHERE.fetch_add(1, Ordering::Relaxed);
            }
        } else if p.0.remove(&fault) {
            PLANTED_ANYWHERE.fetch_sub(1, Ordering::Relaxed);
        }
    });
}

/// Whether `fault` is planted on the calling thread.
#[must_use]
pub fn on(fault: Fault) -> bool {
    PLANTED_ANYWHERE.load(Ordering::Relaxed) != 0 && PLANTED.with(|p| p.borrow().on(fault))
}

/// The fault named `name` among `known` (a crate's list, as [`CORE`]).
#[must_use]
pub fn by_name(known: &[Fault], name: &str) -> Option<Fault> {
    known.iter().copied().find(|f| f.name() == name)
}

/// Lifts its fault when dropped: see [`plant`].
#[derive(Debug)]
pub struct Planted(Fault);

impl Drop for Planted {
    fn drop(&mut self) {
        set(self.0, false);
    }
}

/// A drain releases a shard at once, without waiting for its admitted work and fences.
pub const SKIP_DRAIN_WAIT: Fault = Fault::new("skip-drain-wait");
/// A shard granted to the read path is activated without the barrier (no consistent read first).
pub const SKIP_ACTIVATION_BARRIER: Fault = Fault::new("skip-activation-barrier");
/// The coordinator treats an owner it has not observed as gone.
pub const UNOBSERVED_IS_GONE: Fault = Fault::new("unobserved-is-gone");
/// A member follows an assignment whose epoch for a shard is lower than the one it holds.
pub const ACCEPT_LOWER_EPOCH: Fault = Fault::new("accept-lower-epoch");
/// A shard forgets the gate a re-grant, cancel-back or release retires: a later drain waits only for the
/// current gate, not for requests still in flight under the retired one.
pub const FORGET_RETIRED_GATES: Fault = Fault::new("forget-retired-gates");
/// The coordinator ignores `kept` reports: it grants a shard another live member holds at a higher epoch
/// (after a rolled-back assignment) without first naming that holder.
pub const GRANT_OVER_KEPT_HOLDER: Fault = Fault::new("grant-over-kept-holder");
/// A member activates a grant at or below a generation it applied before that view (a grant only a
/// rolled-back assignment can make), instead of reporting it `stale`.
pub const ACTIVATE_ROLLED_BACK_GRANT: Fault = Fault::new("activate-rolled-back-grant");

/// The read path drops its re-enqueues (objects of gained, un-fenced or un-held shards) instead of handing
/// them to `Controller::reconcile_on`.
pub const DROP_REENQUEUE: Fault = Fault::new("drop-reenqueue");

/// The core's fault points.
pub const CORE: [Fault; 8] = [
    SKIP_DRAIN_WAIT,
    SKIP_ACTIVATION_BARRIER,
    UNOBSERVED_IS_GONE,
    ACCEPT_LOWER_EPOCH,
    FORGET_RETIRED_GATES,
    GRANT_OVER_KEPT_HOLDER,
    ACTIVATE_ROLLED_BACK_GRANT,
    DROP_REENQUEUE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_fault_is_on_for_its_thread_until_its_guard_drops() {
        assert!(!on(SKIP_DRAIN_WAIT));
        {
            let _g = plant(SKIP_DRAIN_WAIT);
            assert!(on(SKIP_DRAIN_WAIT));
            assert!(!on(UNOBSERVED_IS_GONE));
            let other = std::thread::spawn(|| on(SKIP_DRAIN_WAIT)).join().unwrap();
            assert!(!other, "planting is per thread");
        }
        assert!(!on(SKIP_DRAIN_WAIT));
    }

    #[test]
    fn names_are_unique_and_found() {
        let names: BTreeSet<_> = CORE.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), CORE.len());
        assert_eq!(
            by_name(&CORE, "forget-retired-gates"),
            Some(FORGET_RETIRED_GATES)
        );
        assert_eq!(by_name(&CORE, "no-such-fault"), None);
        let set = Faults::none().with(ACCEPT_LOWER_EPOCH);
        assert!(set.on(ACCEPT_LOWER_EPOCH) && !set.on(SKIP_DRAIN_WAIT));
    }
}
