//! Planting one of the library's fault points for one seed (`--plant NAME`).

use kube_shard::testing::faults::{self, Fault};

/// Plant `name` on the calling thread; returns what to lift afterwards.
///
/// # Panics
/// When `name` is not a fault point of the core.
pub fn switch_on(name: Option<&str>) -> Option<Fault> {
    let name = name?;
    let fault = faults::by_name(&faults::CORE, name)
        .unwrap_or_else(|| panic!("no fault point {name:?}; known: {:?}", names()));
    faults::set(fault, true);
    Some(fault)
}

/// Lift it again.
pub fn switch_off(fault: Option<Fault>) {
    if let Some(f) = fault {
        faults::set(f, false);
    }
}

/// The names of the fault points that can be planted.
#[must_use]
pub fn names() -> Vec<&'static str> {
    faults::CORE.iter().map(|f| f.name()).collect()
}
