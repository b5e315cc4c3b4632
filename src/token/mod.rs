//! The fence token on the wire: `"<failover-epoch>:<shard>/<shard-epoch>"`, or `"<failover-epoch>:mirror"`
//! for the HA mirror's writes. Fenced writes carry it in the [`FENCE_HEADER`] request header (every write,
//! status writes included) and in the [`FENCE_ANNOTATION`] annotation (main-resource writes).
//!
//! The failover epoch is the wire integer of [`FailoverEpoch`], `0` without HA. [`FenceToken::refusal_over`]
//! is the order the generated policies enforce: failover epochs first, then the shard rules. Legacy tokens
//! `"<shard>/<epoch>"` parse as failover epoch 0; tokens are always rendered in the new form.
//!
//! Pure: no I/O, no async. See `docs/ha.md#fenced-by-the-server`.

use std::{fmt, str::FromStr};

mod failover;

pub use failover::{FailoverEpoch, FailoverEpochError, MAX_N, RANKS};

/// The annotation fenced writes stamp on main-resource writes.
pub const FENCE_ANNOTATION: &str = "kube-shard.io/fence";

/// The request header fenced writes send on every write (a CRD's `/status` ignores metadata changes,
/// so the annotation alone cannot carry the fence there).
pub const FENCE_HEADER: &str = "x-kube-shard-fence";

/// The shard part of a token in place of `<shard>/<shard-epoch>` on the HA mirror's writes.
pub const MIRROR: &str = "mirror";

/// What a token fences besides the failover epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A shard owner's write: the logical shard and the shard epoch at which the writer owned it.
    Shard {
        /// The logical shard.
        shard: u32,
        /// The shard epoch (a generation of one shard group's assignment).
        epoch: u64,
    },
    /// The HA mirror's write (`<f>:mirror`): the shard rules do not apply.
    Mirror,
}

/// A fence token as sent with a write: the failover epoch and the [`Scope`].
///
/// ```
/// use kube_shard::token::{FailoverEpoch, FenceToken};
/// let t: FenceToken = "5007:17/1764460800000".parse().unwrap();
/// assert_eq!(t.failover(), FailoverEpoch::new(5, 7).unwrap());
/// assert_eq!((t.shard(), t.shard_epoch()), (Some(17), Some(1764460800000)));
/// assert_eq!(t.to_string(), "5007:17/1764460800000");
/// assert_eq!("2001:mirror".parse::<FenceToken>().unwrap(), FenceToken::mirror(FailoverEpoch::new(2, 1).unwrap()));
/// // a legacy token: failover epoch 0
/// assert_eq!("17/9".parse::<FenceToken>().unwrap().to_string(), "0:17/9");
/// assert!("17".parse::<FenceToken>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FenceToken {
    failover: FailoverEpoch,
    scope: Scope,
}

/// Why the server fence refuses a write's token over the stored object's ([`FenceToken::refusal_over`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The write's failover epoch is lower than the stored one: a deposed Active wrote.
    #[error("the failover epoch is lower than the stored object's")]
    FailoverEpoch,
    /// Equal failover epochs, and the write names another shard.
    #[error("the token names another shard than the stored object's")]
    Shard,
    /// Equal failover epochs, same shard, and the write's shard epoch is lower: the writer lost the shard.
    #[error("the shard epoch is lower than the stored object's")]
    ShardEpoch,
}

impl FenceToken {
    /// A shard owner's token.
    #[must_use]
    pub fn shard_token(failover: FailoverEpoch, shard: u32, epoch: u64) -> Self {
        FenceToken {
            failover,
            scope: Scope::Shard { shard, epoch },
        }
    }

    /// The HA mirror's token `<f>:mirror`, `f` the failover epoch of the source cluster's term.
    #[must_use]
    pub fn mirror(failover: FailoverEpoch) -> Self {
        FenceToken {
            failover,
            scope: Scope::Mirror,
        }
    }

    /// The failover epoch (0 without HA, and for a legacy token).
    #[must_use]
    pub fn failover(&self) -> FailoverEpoch {
        self.failover
    }

    /// What the token fences besides the failover epoch.
    #[must_use]
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The shard, unless this is a mirror token.
    #[must_use]
    pub fn shard(&self) -> Option<u32> {
        match self.scope {
            Scope::Shard { shard, .. } => Some(shard),
            Scope::Mirror => None,
        }
    }

    /// The shard epoch, unless this is a mirror token.
    #[must_use]
    pub fn shard_epoch(&self) -> Option<u64> {
        match self.scope {
            Scope::Shard { epoch, .. } => Some(epoch),
            Scope::Mirror => None,
        }
    }

    /// The server fence's verdict on a write carrying `self` over an object stamped `stored`: failover
    /// epochs first (lower → refuse, higher → accept), then, when equal and neither is a mirror token, the
    /// shard rules (same shard, shard epoch not lower). `None`: accepted.
    #[must_use]
    pub fn refusal_over(&self, stored: &FenceToken) -> Option<Refusal> {
        if self.failover != stored.failover {
            return (self.failover < stored.failover).then_some(Refusal::FailoverEpoch);
        }
        match (self.scope, stored.scope) {
            (Scope::Shard { shard, epoch }, Scope::Shard { shard: s, epoch: e }) => {
                if shard != s {
                    Some(Refusal::Shard)
                } else if epoch < e {
                    Some(Refusal::ShardEpoch)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The audit's order, whatever shard either names (shard epochs are generations of one assignment, so
    /// a lower one was written under an older assignment): `self` is behind `highest` when its failover epoch
    /// is lower, or equal with a lower shard epoch (mirror tokens have none to compare).
    #[must_use]
    pub fn is_behind(&self, highest: &FenceToken) -> bool {
        match self.failover.cmp(&highest.failover) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => matches!(
                (self.shard_epoch(), highest.shard_epoch()),
                (Some(a), Some(b)) if a < b
            ),
        }
    }

    /// The new highest after `self` was committed over `highest` (when not [behind](Self::is_behind) it):
    /// `self`, except that a mirror token at the same failover epoch keeps `highest`'s shard epoch.
    #[must_use]
    pub fn raise(&self, highest: Option<&FenceToken>) -> FenceToken {
        match highest {
            Some(h) if h.failover == self.failover && self.scope == Scope::Mirror => *h,
            Some(h) if self.is_behind(h) => *h,
            _ => *self,
        }
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            Scope::Shard { shard, epoch } => write!(f, "{}:{shard}/{epoch}", self.failover.wire()),
            Scope::Mirror => write!(f, "{}:{MIRROR}", self.failover.wire()),
        }
    }
}

impl FromStr for FenceToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || TokenError(s.chars().take(64).collect());
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let (failover, rest) = match s.split_once(':') {
            Some((f, rest)) => {
                // at most 10 digits: the wire form fits an i32 (and CEL's int)
                if !digits(f) || f.len() > 10 {
                    return Err(bad());
                }
                let wire: u64 = f.parse().map_err(|_| bad())?;
                (
                    FailoverEpoch::from_wire(wire).map_err(|_| bad())?,
                    Some(rest),
                )
            }
            None => (FailoverEpoch::default(), None),
        };
        let rest = rest.unwrap_or(s);
        if rest == MIRROR && s.contains(':') {
            return Ok(FenceToken::mirror(failover));
        }
        let (shard, epoch) = rest.split_once('/').ok_or_else(bad)?;
        // the policies' limits: shard at most 9 digits, shard epoch at most 18
        if !digits(shard) || !digits(epoch) || shard.len() > 9 || epoch.len() > 18 {
            return Err(bad());
        }
        Ok(FenceToken::shard_token(
            failover,
            shard.parse().map_err(|_| bad())?,
            epoch.parse().map_err(|_| bad())?,
        ))
    }
}

/// A fence token that is not `"<failover-epoch>:<shard>/<shard-epoch>"`, `"<failover-epoch>:mirror"` or a
/// legacy `"<shard>/<epoch>"`, with unsigned decimal numbers within the limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fence token {0:?}: expected \"<failover-epoch>:<shard>/<shard-epoch>\" or \"<failover-epoch>:mirror\" with unsigned decimal numbers (failover epoch at most 10 digits and a valid epoch, shard at most 9, shard epoch at most 18)")]
pub struct TokenError(String);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(w: u64) -> FailoverEpoch {
        FailoverEpoch::from_wire(w).unwrap()
    }

    #[test]
    fn hostile_tokens_are_errors() {
        for bad in [
            "",
            "/",
            ":",
            "1/",
            "/1",
            "a/1",
            "1/b",
            "-1/2",
            "1/2/3",
            "+1/2",
            "1 /2",
            "9999999999/1",
            "1/9999999999999999999",
            "mirror",
            ":mirror",
            "1:",
            "1:/",
            ":1/2",
            "1:2",
            "1:2:3/4",
            "1::2/3",
            "-1:2/3",
            "1:mirror/2",
            "1:MIRROR",
            "99999999999:1/2",
            "2147483648:1/2",
            "0:1/2 ",
            "0:1/+2",
        ] {
            assert!(bad.parse::<FenceToken>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "0/0".parse::<FenceToken>(),
            Ok(FenceToken::shard_token(FailoverEpoch::default(), 0, 0))
        );
        assert_eq!(
            "0:mirror".parse::<FenceToken>(),
            Ok(FenceToken::mirror(FailoverEpoch::default()))
        );
    }

    #[test]
    fn failover_first_then_shard_rules_and_mirror_skips_them() {
        let t = |s: &str| s.parse::<FenceToken>().unwrap();
        assert_eq!(
            t("1000:3/5").refusal_over(&t("2001:3/1")),
            Some(Refusal::FailoverEpoch)
        );
        assert_eq!(t("2001:9/1").refusal_over(&t("1000:3/5")), None);
        assert_eq!(
            t("2001:9/1").refusal_over(&t("2001:3/5")),
            Some(Refusal::Shard)
        );
        assert_eq!(
            t("2001:3/1").refusal_over(&t("2001:3/5")),
            Some(Refusal::ShardEpoch)
        );
        assert_eq!(t("2001:3/5").refusal_over(&t("2001:3/5")), None);
        assert_eq!(t("2001:mirror").refusal_over(&t("2001:3/5")), None);
        assert_eq!(t("2001:3/1").refusal_over(&t("2001:mirror")), None);
        assert_eq!(
            t("1000:mirror").refusal_over(&t("2001:mirror")),
            Some(Refusal::FailoverEpoch)
        );
        // legacy = failover epoch 0: never over an HA-stamped object, as before between legacy ones
        assert_eq!(
            t("3/9").refusal_over(&t("1:3/1")),
            Some(Refusal::FailoverEpoch)
        );
        assert_eq!(t("3/1").refusal_over(&t("3/9")), Some(Refusal::ShardEpoch));
        assert_eq!(t("0:3/9").refusal_over(&t("3/9")), None);
    }

    #[test]
    fn the_audit_order_ignores_the_shard_and_keeps_the_highest() {
        let t = |s: &str| s.parse::<FenceToken>().unwrap();
        assert!(t("1000:3/9").is_behind(&t("2001:5/1")));
        assert!(t("2001:3/1").is_behind(&t("2001:5/2")));
        assert!(!t("2001:mirror").is_behind(&t("2001:5/2")));
        assert!(!t("3001:3/1").is_behind(&t("2001:5/2")));
        assert_eq!(t("2001:mirror").raise(Some(&t("2001:5/2"))), t("2001:5/2"));
        assert_eq!(
            t("3001:mirror").raise(Some(&t("2001:5/2"))),
            t("3001:mirror")
        );
        assert_eq!(t("2001:5/3").raise(Some(&t("2001:mirror"))), t("2001:5/3"));
        assert_eq!(t("2001:5/3").raise(None), t("2001:5/3"));
    }

    proptest! {
        #[test]
        fn hostile_text_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<FenceToken>();
        }

        #[test]
        fn token_like_text_never_panics(s in "[0-9:/mirox+ -]{0,30}") {
            if let Ok(t) = s.parse::<FenceToken>() {
                // what parses renders to a token that parses back to itself
                prop_assert_eq!(t.to_string().parse::<FenceToken>(), Ok(t));
            }
        }

        #[test]
        fn round_trips(w in 0..failover::MAX_N * 1000, shard in 0u32..1_000_000_000, epoch in 0u64..=999_999_999_999_999_999) {
            let t = FenceToken::shard_token(e(w), shard, epoch);
            prop_assert_eq!(t.to_string().parse::<FenceToken>(), Ok(t));
            let m = FenceToken::mirror(e(w));
            prop_assert_eq!(m.to_string().parse::<FenceToken>(), Ok(m));
        }

        #[test]
        fn refusal_is_the_failover_order_when_epochs_differ(a in 0u64..5000, b in 0u64..5000, s1 in 0u32..3, s2 in 0u32..3, e1 in 0u64..3, e2 in 0u64..3) {
            let x = FenceToken::shard_token(e(a), s1, e1);
            let y = FenceToken::shard_token(e(b), s2, e2);
            if a != b {
                prop_assert_eq!(x.refusal_over(&y).is_some(), a < b);
            }
        }
    }
}
