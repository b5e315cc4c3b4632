//! The fence token on the wire: `"<shard>/<epoch>"`, carried by fenced writes in the
//! [`FENCE_HEADER`] request header (every write, status writes included) and in the
//! [`FENCE_ANNOTATION`] annotation (main-resource writes). testserver's fence audit reads the same format.
//!
//! Pure: no I/O, no async.

use std::{fmt, str::FromStr};

/// The annotation fenced writes stamp on main-resource writes.
pub const FENCE_ANNOTATION: &str = "kube-shard.io/fence";

/// The request header fenced writes send on every write (a CRD's `/status` ignores metadata changes,
/// so the annotation alone cannot carry the fence there).
pub const FENCE_HEADER: &str = "x-kube-shard-fence";

/// A `(shard, epoch)` pair as sent with a write, rendered `"<shard>/<epoch>"`.
///
/// ```
/// use kube_shard::token::FenceToken;
/// let t: FenceToken = "17/1764460800000".parse().unwrap();
/// assert_eq!((t.shard, t.epoch), (17, 1764460800000));
/// assert_eq!(t.to_string(), "17/1764460800000");
/// assert!("17".parse::<FenceToken>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceToken {
    /// The logical shard.
    pub shard: u32,
    /// The epoch at which the writer owned the shard.
    pub epoch: u64,
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.shard, self.epoch)
    }
}

impl FromStr for FenceToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || TokenError(s.chars().take(64).collect());
        let (shard, epoch) = s.split_once('/').ok_or_else(bad)?;
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(shard) || !digits(epoch) {
            return Err(bad());
        }
        Ok(FenceToken {
            shard: shard.parse().map_err(|_| bad())?,
            epoch: epoch.parse().map_err(|_| bad())?,
        })
    }
}

/// A fence token that is not `"<shard>/<epoch>"` with two unsigned decimal numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fence token {0:?}: expected \"<shard>/<epoch>\" with unsigned decimal numbers")]
pub struct TokenError(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_tokens_are_errors() {
        for bad in [
            "",
            "/",
            "1/",
            "/1",
            "a/1",
            "1/b",
            "-1/2",
            "1/2/3",
            "+1/2",
            "1 /2",
            "99999999999/1",
            "1/99999999999999999999999",
        ] {
            assert!(bad.parse::<FenceToken>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "0/0".parse::<FenceToken>(),
            Ok(FenceToken { shard: 0, epoch: 0 })
        );
    }
}
