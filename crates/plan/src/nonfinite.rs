//! Serde for `Vec<f64>` that carries NaN and infinities: JSON has no such numbers (serde_json
//! writes them as `null`, which does not read back as an f64), so a non-finite element travels
//! as the string "NaN", "inf" or "-inf". A worker's NaN loss thus reaches the launcher intact,
//! which then names the rank and step instead of failing to read the report.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Num {
    Finite(f64),
    Tagged(String),
}

/// Writes finite values as numbers and the rest as "NaN", "inf", "-inf".
pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
    let tagged: Vec<Num> = v
        .iter()
        .map(|&x| match x {
            x if x.is_finite() => Num::Finite(x),
            x if x.is_nan() => Num::Tagged("NaN".into()),
            x if x > 0.0 => Num::Tagged("inf".into()),
            _ => Num::Tagged("-inf".into()),
        })
        .collect();
    tagged.serialize(s)
}

/// Reads numbers and the three tags back; any other string is an error naming it.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Vec::<Num>::deserialize(d)?
        .into_iter()
        .map(|n| match n {
            Num::Finite(x) => Ok(x),
            Num::Tagged(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!(
                    "\"{other}\" is not a number (expected a number, \"NaN\", \"inf\" or \"-inf\")"
                ))),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct W {
        #[serde(with = "super")]
        v: Vec<f64>,
    }

    #[test]
    fn non_finite_values_survive_json_and_plain_json_would_lose_them() {
        let w = W {
            v: vec![2.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0],
        };
        let json = serde_json::to_string(&w).unwrap();
        assert_eq!(json, r#"{"v":[2.5,"NaN","inf","-inf",-0.0]}"#);
        let back: W = serde_json::from_str(&json).unwrap();
        assert_eq!(back.v[0], 2.5);
        assert!(back.v[1].is_nan());
        assert_eq!(back.v[2..4], [f64::INFINITY, f64::NEG_INFINITY]);
        assert!(back.v[4] == 0.0 && back.v[4].is_sign_negative());
        // Why this exists: a bare Vec<f64> with a NaN writes null and does not read back.
        let plain = serde_json::to_string(&vec![f64::NAN]).unwrap();
        assert!(serde_json::from_str::<Vec<f64>>(&plain).is_err());
        let e = serde_json::from_str::<W>(r#"{"v":["nan?"]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("nan?"), "{e}");
    }
}
