//! Keyed draws for the engine: the draw itself (`tensorfold_kernels::sample`, which backends run beside the head,
//! re-exported), the reply's seed that keys it, and the reply's token hash.

use rand::TryRngCore;
use sha2::{Digest, Sha256};
pub use tensorfold_kernels::sample::{DrawSpec, SampleError, SamplingParams, draw, greedy_pick};

/// The reply's seed: the requested one, or a fresh one from the OS RNG.
///
/// Two unseeded sampled requests therefore differ, and the seed is reported back so the
/// reply can be reproduced. Should the OS RNG fail, falls back to the thread RNG (itself
/// seeded from the OS) rather than panicking.
pub fn resolve_seed(requested: Option<u64>) -> u64 {
    requested.unwrap_or_else(|| rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| rand::random()))
}

/// The reply's token hash: lowercase hex SHA-256 of the decimal ids joined by commas
/// (`[1, 2, 3]` hashes the ASCII bytes `1,2,3`; `[]` hashes the empty string).
pub fn token_sha256(ids: &[u32]) -> String {
    let mut hasher = Sha256::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            hasher.update(b",");
        }
        hasher.update(id.to_string().as_bytes());
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_resolve() {
        assert_eq!(resolve_seed(Some(17)), 17);
        assert_ne!(resolve_seed(None), resolve_seed(None));
    }

    #[test]
    fn token_hash_is_sha256_of_comma_joined_ids() {
        assert_eq!(token_sha256(&[1, 2, 3]), "8a6ae15122001229edb8866f56e342af12ae8187203c3e3b33931743e7c0c48d");
        assert_eq!(token_sha256(&[]), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
