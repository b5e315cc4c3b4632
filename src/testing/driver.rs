//! Drivers: grant shards, report warm and activation, renew and self-fence,
//! without a control plane. Never enable this feature in production builds.
//!
//! ```
//! use kube_shard::group::assignment::{AssignmentView, ShardAssignment};
//! use kube_shard::ownership::{MemberId, OwnershipConfig};
//! use kube_shard::testing;
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! # rt.block_on(async {
//! let me = MemberId::new("pod-0", "a");
//! let (ownership, driver) = testing::driver(OwnershipConfig::default(), me.clone());
//! driver.renew();
//! driver.apply(&AssignmentView::new(1).with(7, ShardAssignment::owned(me, 1)));
//! driver.activate(7, 1);
//! assert!(ownership.admit_shard(7).is_ok());
//! # });
//! ```

use crate::ownership::state::{Applied, AssignmentView, Event, MemberId, MoveId};
use crate::ownership::{Ownership, OwnershipConfig};
use crate::rt::Clock;

/// Drives an [`Ownership`] the way the control plane and the read path will.
#[derive(Debug, Clone)]
pub struct TestDriver {
    ownership: Ownership,
}

/// A new member's ownership and its driver, on the system clocks.
pub fn driver(config: OwnershipConfig, me: MemberId) -> (Ownership, TestDriver) {
    driver_with_clock(config, me, Clock::system())
}

/// A new member's ownership and its driver, on the given clocks.
pub fn driver_with_clock(
    config: OwnershipConfig,
    me: MemberId,
    clock: Clock,
) -> (Ownership, TestDriver) {
    let ownership = Ownership::new(config, me, clock);
    (ownership.clone(), TestDriver { ownership })
}

impl TestDriver {
    /// Apply an assignment view (ignored unless its generation is newer).
    pub fn apply(&self, view: &AssignmentView) -> Applied {
        self.ownership.apply_view(view)
    }

    /// Any local event.
    pub fn event(&self, event: Event) -> Applied {
        self.ownership.apply_event(event)
    }

    /// The read path synced `shard` for `move_id`.
    pub fn warm(&self, shard: u32, move_id: MoveId) -> Applied {
        self.ownership.apply_event(Event::Warm { shard, move_id })
    }

    /// The activation barrier of `shard` at `epoch` holds.
    pub fn activate(&self, shard: u32, epoch: u64) -> Applied {
        self.ownership
            .apply_event(Event::Activated { shard, epoch })
    }

    /// A renewal that started now.
    pub fn renew(&self) -> Applied {
        let now = self.ownership.inner.clock.now();
        self.ownership.record_renewal(now)
    }

    /// A renewal that started at `start`.
    pub fn renew_at(&self, start: crate::rt::Now) -> Applied {
        self.ownership.record_renewal(start)
    }

    /// The member's lease was taken over: fenced until a renewal.
    pub fn taken_over(&self) -> Applied {
        self.ownership.revoke_renewal()
    }
}
