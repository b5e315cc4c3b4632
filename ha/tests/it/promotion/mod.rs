//! Promotion and what surrounds it: adoption and failback, planned switchover, the minimum-epoch fence.

mod adopt;
mod min_epoch;
mod switchover;
