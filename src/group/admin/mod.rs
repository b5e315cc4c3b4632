//! A group read and edited from outside it, as `kshard status`, `pin`, `drain` and the tests do: the one
//! reader of the assignment, the member Leases and the coordinator Lease ([`GroupView`]), and the one writer
//! of the assignment's intent fields beside the coordinator ([`edit`]: pins, pause, drained members; never
//! owners, epochs or handoffs). See `docs/control-plane.md#operating-a-group-from-outside`.
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> Result<(), kube_shard::group::admin::AdminError> {
//! use kube_shard::group::admin::{Edit, GroupRef};
//! let g = GroupRef::new(client, "default", "widgets");
//! let view = g.read().await?;
//! println!("generation {}, {} members", view.assignment.view.generation, view.members.len());
//! g.edit(Edit::Drain("widgets-7c9f".into())).await?;
//! # Ok(()) }
//! ```

mod edit;
mod types;
mod view;

pub use edit::edit;
pub use types::{AdminError, Edit, GroupRef};
pub use view::{GroupView, MemberLease, MemberView};
