//! The residual file (calibration/residuals.json, or a user's): how it was made, the
//! percentiles, the back-off order and every residual with its regime. Read field by field so
//! that a bad file is refused naming the field and the rule.

use super::regime::{Dimension, Regime, DIMENSIONS, REGIME_DIMENSIONS};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// One prediction's error: ln(measured step time / predicted step time), with where it comes
/// from and its regime.
#[derive(Debug, Clone, PartialEq)]
pub struct Residual {
    /// The table or measurement file the measured figure comes from.
    pub source: String,
    /// The row or run.
    pub row: String,
    pub regime: Regime,
    pub log_ratio: f64,
}

/// A residual model as data.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidualFile {
    /// How the residuals were made (what was fitted, what was held out).
    pub about: String,
    /// The command that rebuilds the file.
    pub command: String,
    pub lower_percentile: f64,
    pub upper_percentile: f64,
    /// The order in which a thin regime is pooled with its neighbours, each dimension at most
    /// once; the dimensions left out are never pooled over (a regime needs evidence in them).
    pub backoff: Vec<Dimension>,
    pub residuals: Vec<Residual>,
}

/// Why a residual file or its percentiles cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IntervalError {
    #[error("cannot read residual file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{origin}: not valid JSON: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: {field}: {rule}")]
    Field {
        origin: String,
        field: String,
        rule: String,
    },
    #[error("lower_percentile {lower} and upper_percentile {upper}: no number of residuals gives both order statistics")]
    Percentiles { lower: f64, upper: f64 },
    #[error(
        "the residual file holds {n} residuals; a {lower}-{upper} interval needs at least {need}"
    )]
    TooFew {
        n: usize,
        need: usize,
        lower: f64,
        upper: f64,
    },
    #[error("no combination of the dimensions `backoff` leaves out holds {need} residuals: no regime has evidence to take the widest spread from")]
    NoEvidence { need: usize },
}

const TOP_KEYS: [&str; 6] = [
    "about",
    "command",
    "lower_percentile",
    "upper_percentile",
    "backoff",
    "residuals",
];
const RESIDUAL_KEYS: [&str; 4] = ["source", "row", "regime", "log_ratio"];

impl ResidualFile {
    /// Reads and validates the file at `path`.
    pub fn read(path: &std::path::Path) -> Result<ResidualFile, IntervalError> {
        let text = std::fs::read_to_string(path).map_err(|source| IntervalError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates `text` (`origin` names it in errors): in one typed pass where the
    /// file is valid (the shipped one is read on every estimate), else field by field, so that
    /// the error names the field and the rule.
    pub fn parse(text: &str, origin: &str) -> Result<ResidualFile, IntervalError> {
        match serde_json::from_str::<TypedFile>(text) {
            Ok(typed) => match typed.valid() {
                Some(file) => Ok(file),
                None => Self::parse_by_field(text, origin),
            },
            Err(_) => Self::parse_by_field(text, origin),
        }
    }

    /// [`ResidualFile::parse`] through a JSON value, field by field, naming the first defect.
    pub(super) fn parse_by_field(text: &str, origin: &str) -> Result<ResidualFile, IntervalError> {
        let v: Value = serde_json::from_str(text).map_err(|e| IntervalError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        let bad = |field: &str, rule: String| IntervalError::Field {
            origin: origin.to_string(),
            field: field.to_string(),
            rule,
        };
        let top = object(&v, "(top level)", &TOP_KEYS, &bad)?;
        let text_of = |k: &str| -> Result<String, IntervalError> {
            top.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(k, "must be a string".into()))
        };
        let percentile = |k: &str| -> Result<f64, IntervalError> {
            let p = top
                .get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| bad(k, "must be a number".into()))?;
            if p > 0.0 && p < 1.0 {
                Ok(p)
            } else {
                Err(bad(k, format!("{p} is outside (0, 1)")))
            }
        };
        let (lower, upper) = (
            percentile("lower_percentile")?,
            percentile("upper_percentile")?,
        );
        if lower >= upper {
            return Err(bad(
                "upper_percentile",
                format!("{upper} must exceed lower_percentile {lower}"),
            ));
        }
        let backoff = backoff(top.get("backoff"), &bad)?;
        let list = top
            .get("residuals")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("residuals", "must be an array".into()))?;
        let residuals = list
            .iter()
            .enumerate()
            .map(|(i, r)| residual(r, &format!("residuals[{i}]"), &bad))
            .collect::<Result<_, _>>()?;
        Ok(ResidualFile {
            about: text_of("about")?,
            command: text_of("command")?,
            lower_percentile: lower,
            upper_percentile: upper,
            backoff,
            residuals,
        })
    }

    /// The file as JSON (what [`ResidualFile::parse`] reads back).
    pub fn to_json(&self) -> Value {
        let residuals: Vec<Value> = self
            .residuals
            .iter()
            .map(|r| {
                let regime: Map<String, Value> = DIMENSIONS
                    .iter()
                    .map(|d| (d.key().to_string(), json!(r.regime.value(*d))))
                    .collect();
                json!({"source": r.source, "row": r.row, "regime": regime, "log_ratio": r.log_ratio})
            })
            .collect();
        json!({
            "about": self.about,
            "command": self.command,
            "lower_percentile": self.lower_percentile,
            "upper_percentile": self.upper_percentile,
            "backoff": self.backoff.iter().map(|d| d.key()).collect::<Vec<_>>(),
            "residuals": residuals,
        })
    }
}

/// A residual file as serde reads it in one pass, strings borrowed from the text where they
/// hold no escape. Any defect (an unknown or missing key, a wrong type) fails the read, and
/// [`ResidualFile::parse`] reads the file again field by field to name it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TypedFile<'a> {
    #[serde(borrow)]
    about: Cow<'a, str>,
    #[serde(borrow)]
    command: Cow<'a, str>,
    lower_percentile: f64,
    upper_percentile: f64,
    #[serde(borrow)]
    backoff: Vec<Cow<'a, str>>,
    #[serde(borrow)]
    residuals: Vec<TypedResidual<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedResidual<'a> {
    #[serde(borrow)]
    source: Cow<'a, str>,
    #[serde(borrow)]
    row: Cow<'a, str>,
    #[serde(borrow)]
    regime: Entries<'a>,
    log_ratio: f64,
}

/// A JSON object of strings as its entries in order, duplicates kept (a regime's bands are
/// plain names: one holding an escape fails the typed read).
struct Entries<'a>(Vec<(&'a str, &'a str)>);

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Entries<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out = Vec::with_capacity(REGIME_DIMENSIONS);
                while let Some(entry) = m.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl TypedFile<'_> {
    /// The file, when it keeps every rule [`ResidualFile::parse_by_field`] checks; `None`
    /// otherwise (that reading names the defect).
    pub(super) fn valid(self) -> Option<ResidualFile> {
        let (lower, upper) = (self.lower_percentile, self.upper_percentile);
        let inside = |p: f64| p > 0.0 && p < 1.0;
        if !(inside(lower) && inside(upper) && lower < upper) {
            return None;
        }
        let mut backoff = Vec::with_capacity(self.backoff.len());
        for name in &self.backoff {
            let d = Dimension::parse(name)?;
            if backoff.contains(&d) {
                return None;
            }
            backoff.push(d);
        }
        let values = DIMENSIONS.map(Dimension::values);
        let residuals = self
            .residuals
            .into_iter()
            .map(|r| {
                // Every dimension once: as many entries as dimensions, none repeated.
                if !r.log_ratio.is_finite() || r.regime.0.len() != REGIME_DIMENSIONS {
                    return None;
                }
                let mut regime = Regime([0; REGIME_DIMENSIONS]);
                let mut given = [false; REGIME_DIMENSIONS];
                for (key, value) in r.regime.0 {
                    let i = DIMENSIONS.iter().position(|d| d.key() == key)?;
                    let band = values[i].iter().position(|v| *v == value)?;
                    if std::mem::replace(&mut given[i], true) {
                        return None;
                    }
                    regime = regime.with(DIMENSIONS[i], band as u8);
                }
                Some(Residual {
                    source: r.source.into_owned(),
                    row: r.row.into_owned(),
                    regime,
                    log_ratio: r.log_ratio,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ResidualFile {
            about: self.about.into_owned(),
            command: self.command.into_owned(),
            lower_percentile: lower,
            upper_percentile: upper,
            backoff,
            residuals,
        })
    }
}

type Bad<'a> = dyn Fn(&str, String) -> IntervalError + 'a;

/// `v` as an object holding exactly `keys` (an unknown or missing one is refused).
fn object<'v>(
    v: &'v Value,
    field: &str,
    keys: &[&str],
    bad: &Bad<'_>,
) -> Result<&'v Map<String, Value>, IntervalError> {
    let m = v
        .as_object()
        .ok_or_else(|| bad(field, "must be an object".into()))?;
    let at = |k: &str| {
        if field.starts_with('(') {
            k.to_string()
        } else {
            format!("{field}.{k}")
        }
    };
    if let Some(k) = m.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(bad(
            &at(k),
            format!("unknown key (known: {})", keys.join(", ")),
        ));
    }
    if let Some(k) = keys.iter().find(|k| !m.contains_key(**k)) {
        return Err(bad(&at(k), "missing".into()));
    }
    Ok(m)
}

/// The back-off order: regime keys, each at most once.
fn backoff(v: Option<&Value>, bad: &Bad<'_>) -> Result<Vec<Dimension>, IntervalError> {
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| bad("backoff", "must be an array of regime keys".into()))?;
    let mut out = Vec::new();
    for (i, k) in list.iter().enumerate() {
        let field = format!("backoff[{i}]");
        let name = k
            .as_str()
            .ok_or_else(|| bad(&field, "must be a string".into()))?;
        let d = Dimension::parse(name).ok_or_else(|| bad(&field, unknown_key(name)))?;
        if out.contains(&d) {
            return Err(bad(&field, format!("{name} is listed twice")));
        }
        out.push(d);
    }
    Ok(out)
}

fn residual(v: &Value, field: &str, bad: &Bad<'_>) -> Result<Residual, IntervalError> {
    let m = object(v, field, &RESIDUAL_KEYS, bad)?;
    let string = |k: &str| {
        m[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(&format!("{field}.{k}"), "must be a string".into()))
    };
    let log_ratio = m["log_ratio"]
        .as_f64()
        .filter(|x| x.is_finite())
        .ok_or_else(|| {
            bad(
                &format!("{field}.log_ratio"),
                "must be a finite number".into(),
            )
        })?;
    let regime_field = format!("{field}.regime");
    let keys: Vec<&str> = DIMENSIONS.iter().map(|d| d.key()).collect();
    let rm = m["regime"]
        .as_object()
        .ok_or_else(|| bad(&regime_field, "must be an object".into()))?;
    if let Some(k) = rm.keys().find(|k| Dimension::parse(k).is_none()) {
        return Err(bad(&format!("{regime_field}.{k}"), unknown_key(k)));
    }
    let mut regime = Regime([0; super::REGIME_DIMENSIONS]);
    for d in DIMENSIONS {
        let f = format!("{regime_field}.{}", d.key());
        let value = rm
            .get(d.key())
            .ok_or_else(|| bad(&f, format!("missing (a regime gives {})", keys.join(", "))))?;
        let name = value
            .as_str()
            .ok_or_else(|| bad(&f, "must be a string".into()))?;
        let index = d.values().iter().position(|v| *v == name).ok_or_else(|| {
            bad(
                &f,
                format!("unknown value {name:?} (known: {})", d.values().join(", ")),
            )
        })?;
        regime = regime.with(d, index as u8);
    }
    Ok(Residual {
        source: string("source")?,
        row: string("row")?,
        regime,
        log_ratio,
    })
}

fn keys_list() -> String {
    DIMENSIONS
        .iter()
        .map(|d| d.key())
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_key(name: &str) -> String {
    format!("unknown regime key {name:?} (known: {})", keys_list())
}
