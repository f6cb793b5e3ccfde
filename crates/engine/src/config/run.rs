//! Whole-run settings (`[run]`): tokens to train, price, power, failures and checkpoints.
//! Absent from a configuration unless set, so an estimate without them is unchanged; the
//! figures they produce live in `planning`, and docs/planning.md cites every default.

use serde::{Deserialize, Serialize};

/// The `[run]` table. Every field is optional: `None` takes the default `planning` cites, or
/// (for the price) leaves the cost out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Tokens to train (`--train-tokens 15.6T`): asks for the run figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_tokens: Option<u64>,
    /// Price of one GPU-hour in US dollars; without it the cost is omitted (no default price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour_usd: Option<f64>,
    /// Power of one node besides its GPUs (CPUs, memory, NICs, fans), in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_power_w_per_node: Option<f64>,
    /// Share of the network switches' power per node, in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_power_w_per_node: Option<f64>,
    /// Power usage effectiveness of the data centre (facility power over IT power, >= 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pue: Option<f64>,
    /// Unexpected interruptions per GPU-hour (a job fails when any of its GPUs' hosts does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate_per_gpu_hour: Option<f64>,
    /// Aggregate write (and read) bandwidth of the checkpoint storage, in bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes_per_s: Option<f64>,
    /// Asynchronous checkpoints: training stalls only for the copy to host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_async: Option<bool>,
    /// Seconds from a failure to training again, before reloading the checkpoint (detection,
    /// rescheduling, process start, NCCL setup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_s: Option<f64>,
    /// A fixed checkpoint interval in seconds of training; absent: Young's optimum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_s: Option<f64>,
    /// A deadline for the run in days: the run section says by how much it is met or missed
    /// (the GUI's deadline; `search --deadline` for the inverse question).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_days: Option<f64>,
}

impl RunConfig {
    /// True when nothing is set (the table is then left out of a serialized configuration).
    pub fn is_empty(&self) -> bool {
        *self == RunConfig::default()
    }
}

/// A token count that [`parse_token_count`] refuses: the text as typed and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "must be a positive whole number of tokens, e.g. 2T, 15.6T, 300B or 1000000{why}, got {value}"
)]
pub struct TokenCountError {
    /// The text as typed (quoted), or `0`.
    pub value: String,
    /// What more the rule says of this value (`" (not a fraction of a token)"`), or nothing.
    pub why: &'static str,
}

/// Parses a token count: a plain integer (`300000000000`) or a number with a K, M, B or T
/// suffix (`300B`, `2T`, `15.6T`); refuses zero, negatives, fractions of a token and overflow.
pub fn parse_token_count(s: &str) -> Result<u64, TokenCountError> {
    let t = s.trim().replace('_', "");
    let (num, scale) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('B' | 'G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        _ => (t.as_str(), 1.0),
    };
    let refused = |why| TokenCountError {
        value: format!("{s:?}"),
        why,
    };
    if scale == 1.0 {
        return match num.parse::<u64>() {
            Ok(0) => Err(TokenCountError {
                value: "0".into(),
                why: "",
            }),
            Ok(n) => Ok(n),
            Err(_) => Err(refused("")),
        };
    }
    let v: f64 = num.parse().map_err(|_| refused(""))?;
    let tokens = v * scale;
    if !tokens.is_finite() || tokens < 1.0 || tokens >= u64::MAX as f64 {
        return Err(refused(""));
    }
    if (tokens - tokens.round()).abs() > 1e-6 * tokens.max(1.0) {
        return Err(refused(" (not a fraction of a token)"));
    }
    Ok(tokens.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_parse_with_suffixes() {
        assert_eq!(parse_token_count("2T"), Ok(2_000_000_000_000));
        assert_eq!(parse_token_count("15.6T"), Ok(15_600_000_000_000));
        assert_eq!(parse_token_count("300B"), Ok(300_000_000_000));
        assert_eq!(parse_token_count("300b"), Ok(300_000_000_000));
        assert_eq!(parse_token_count("1000000"), Ok(1_000_000));
        assert_eq!(parse_token_count("1.5M"), Ok(1_500_000));
    }

    #[test]
    fn bad_token_counts_are_refused() {
        for bad in [
            "0", "-2T", "0T", "abc", "T", "", "1e400T", "NaNT", "infT", "1.5", "-5",
        ] {
            assert!(parse_token_count(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn an_empty_run_table_is_empty() {
        assert!(RunConfig::default().is_empty());
        let r = RunConfig {
            train_tokens: Some(1),
            ..RunConfig::default()
        };
        assert!(!r.is_empty());
    }
}
