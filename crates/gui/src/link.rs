//! A what-if as a link: the configuration travels in the URL fragment as percent-encoded TOML
//! (`#config=...`, the CLI's `--config` format), so a link reproduces it exactly. A fragment
//! that does not parse or validate gives the engine's own error, naming the field, as
//! `parsim estimate --config` would; the caller keeps the configuration it had.

use parsim::config::{load, Config, ConfigError, Layer, Resolved};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// The fragment's key: `#config=<percent-encoded TOML>`.
pub const KEY: &str = "config=";

/// Where a fragment's configuration comes from, in its errors (the CLI names the file).
pub const ORIGIN: &str = "URL #config";

/// Left as they are: the characters a URL fragment carries unescaped and that keep TOML
/// readable in the address bar.
const KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The fragment (without `#`) that carries `config`.
pub fn encode(config: &Config) -> String {
    format!("{KEY}{}", utf8_percent_encode(&config.to_toml(), KEEP))
}

/// The configuration a fragment carries: `Ok(None)` when it carries none (empty, or no
/// `config=` part), else the configuration, checked by the engine's rules. Parts of the
/// fragment are separated by `&`; other parts are ignored.
pub fn decode(fragment: &str) -> Result<Option<Config>, String> {
    let fragment = fragment.strip_prefix('#').unwrap_or(fragment);
    let Some(encoded) = fragment.split('&').find_map(|p| p.strip_prefix(KEY)) else {
        return Ok(None);
    };
    let text = percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|e| format!("{ORIGIN}: not UTF-8 after percent-decoding: {e}"))?;
    let value = load::parse_toml(&text, ORIGIN).map_err(|e| e.to_string())?;
    let layer = Layer {
        origin: ORIGIN.into(),
        base_dir: None,
        value,
    };
    let config = Config::from_layers(&[layer]).map_err(|e| e.to_string())?;
    // The CLI refuses an invalid configuration before it estimates anything: so does the link.
    Resolved::new(config.clone()).map_err(|e: ConfigError| e.to_string())?;
    Ok(Some(config))
}

/// True when the fragment has the part `flag` on its own (`#config=...&search`).
pub fn has_flag(fragment: &str, flag: &str) -> bool {
    let fragment = fragment.strip_prefix('#').unwrap_or(fragment);
    fragment.split('&').any(|p| p == flag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::default_config;

    #[test]
    fn a_link_carries_every_field() {
        let mut c = default_config();
        c.model.num_layers = 24;
        c.parallel.zero = 2;
        c.training.recompute = parsim::config::Recompute::Full;
        c.cluster.gpu = "a100-80g".into();
        let fragment = encode(&c);
        assert!(fragment.starts_with(KEY));
        // Only URL-safe characters remain (RFC 3986 unreserved, and the escapes).
        let body = &fragment[KEY.len()..];
        assert!(body
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "-_.~%".contains(ch)));
        assert_eq!(decode(&format!("#{fragment}")).unwrap(), Some(c.clone()));
        assert_eq!(decode(&format!("x=1&{fragment}")).unwrap(), Some(c));
    }

    #[test]
    fn no_config_part_is_no_configuration() {
        assert_eq!(decode("").unwrap(), None);
        assert_eq!(decode("#view=search").unwrap(), None);
        assert!(has_flag("#config=x&search", "search"));
        assert!(!has_flag("#config=search", "search"));
    }

    /// A hand-written TOML in the fragment (as a person would paste it) decodes like the
    /// same file given to the CLI.
    #[test]
    fn a_partial_toml_starts_from_the_defaults() {
        let got = decode("config=%5Bmodel%5D%0Apreset%20%3D%20%22llama3-8b%22%0A%5Bcluster%5D%0Anum_gpus%20%3D%2016")
            .unwrap()
            .unwrap();
        assert_eq!(got.cluster.num_gpus, 16);
        assert_eq!(got.model.name, "llama3-8b");
    }

    /// The error is the engine's, naming the field, as `parsim estimate --config FILE` gives
    /// it (the origin is the URL instead of the file).
    #[test]
    fn a_malformed_fragment_names_the_field_like_the_cli() {
        let bad = "config=%5Bcluster%5D%0Anum_gpus%20%3D%20%22eight%22";
        let e = decode(bad).unwrap_err();
        assert!(e.starts_with(ORIGIN), "{e}");
        assert!(
            e.contains("field `cluster.num_gpus`: invalid type: string \"eight\", expected u32"),
            "{e}"
        );
        // A well-formed document that breaks a rule: the rule's field and text.
        let e = decode("config=%5Bparallel%5D%0Atp%20%3D%203").unwrap_err();
        assert!(
            e.contains("parallel.tp: num_attention_heads (32) must be divisible by tp (3)"),
            "{e}"
        );
        // Not TOML at all, and not UTF-8.
        assert!(decode("config=%5Bcluster").unwrap_err().starts_with(ORIGIN));
        assert!(decode("config=%FF").unwrap_err().contains("UTF-8"));
    }
}
