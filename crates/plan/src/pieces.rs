//! Exported tensors in pieces: what a rank holds of each global parameter (or gradient)
//! tensor, as runs of consecutive flat indices, and their merge into whole tensors. In one
//! process every rank's pieces merge at once; in a launched job each process sends its rank's
//! pieces with its report and rank 0 merges them (the launcher's `worker::combine`), so the
//! exported model is whole however TP, PP, EP or ZeRO split it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Consecutive elements of a global tensor from flat index `start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub start: usize,
    pub values: Vec<f32>,
}

/// Per global tensor name, the pieces one rank (or process) holds.
pub type TensorPieces = BTreeMap<String, Vec<Piece>>;

/// Global tensors that the pieces leave incomplete.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("exported tensor {tensor}: elements {first_missing}..{missing_end} of {len} are held by no rank")]
pub struct MissingElements {
    pub tensor: String,
    pub first_missing: usize,
    pub missing_end: usize,
    pub len: usize,
}

/// The pieces of (tensor name, flat index, value) elements: sorted by index, an element
/// repeated (a replicated tensor) kept once (its first value), consecutive indices joined.
pub fn pieces_of(elements: &[(String, usize, f32)]) -> TensorPieces {
    let mut by_name: BTreeMap<&str, Vec<(usize, f32)>> = BTreeMap::new();
    for (name, i, v) in elements {
        by_name.entry(name).or_default().push((*i, *v));
    }
    by_name
        .into_iter()
        .map(|(name, mut items)| {
            items.sort_by_key(|x| x.0);
            items.dedup_by_key(|x| x.0);
            let mut out: Vec<Piece> = Vec::new();
            for (i, v) in items {
                match out.last_mut() {
                    Some(p) if p.start + p.values.len() == i => p.values.push(v),
                    _ => out.push(Piece {
                        start: i,
                        values: vec![v],
                    }),
                }
            }
            (name.to_string(), out)
        })
        .collect()
}

/// Whole tensors from every holder's pieces, in holder order: an element held twice takes the
/// first holder's value; a tensor's length is the end of its last piece, and an element below
/// it that no holder has is an error naming the tensor and the elements.
pub fn merge(
    holders: impl IntoIterator<Item = TensorPieces>,
) -> Result<BTreeMap<String, Vec<f32>>, MissingElements> {
    let mut all: BTreeMap<String, Vec<Piece>> = BTreeMap::new();
    for h in holders {
        for (name, ps) in h {
            all.entry(name).or_default().extend(ps);
        }
    }
    all.into_iter()
        .map(|(name, ps)| {
            let len = ps
                .iter()
                .map(|p| p.start + p.values.len())
                .max()
                .unwrap_or(0);
            let mut out = vec![0.0f32; len];
            let mut have = vec![false; len];
            for p in &ps {
                for (j, &v) in p.values.iter().enumerate() {
                    let i = p.start + j;
                    if !have[i] {
                        (out[i], have[i]) = (v, true);
                    }
                }
            }
            if let Some(first) = have.iter().position(|h| !h) {
                let end = have[first..]
                    .iter()
                    .position(|h| *h)
                    .map_or(len, |k| first + k);
                return Err(MissingElements {
                    tensor: name,
                    first_missing: first,
                    missing_end: end,
                    len,
                });
            }
            Ok((name, out))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(name: &str, idx: &[usize]) -> Vec<(String, usize, f32)> {
        idx.iter()
            .map(|&i| (name.to_string(), i, i as f32 * 1.5))
            .collect()
    }

    #[test]
    fn consecutive_indices_join_into_pieces_and_repeats_count_once() {
        // A column shard of a 4 x 4 matrix (columns 2, 3: two elements a row) and a norm
        // weight listed twice.
        let mut e = el("w", &[14, 15, 2, 3, 6, 7, 10, 11]);
        e.extend(el("g", &[0, 1, 2, 0, 1, 2]));
        let p = pieces_of(&e);
        let starts: Vec<(usize, usize)> =
            p["w"].iter().map(|x| (x.start, x.values.len())).collect();
        assert_eq!(starts, vec![(2, 2), (6, 2), (10, 2), (14, 2)]);
        assert_eq!(
            p["g"],
            vec![Piece {
                start: 0,
                values: vec![0.0, 1.5, 3.0]
            }]
        );
    }

    /// Two TP halves by columns and two by rows, with a replicated tensor on both: the merge
    /// is the whole tensor element for element.
    #[test]
    fn holders_merge_into_the_whole_tensors() {
        let left = pieces_of(&[el("w", &[0, 1, 4, 5, 8, 9]), el("g", &[0, 1])].concat());
        let right = pieces_of(&[el("w", &[2, 3, 6, 7, 10, 11]), el("g", &[0, 1])].concat());
        let got = merge([right, left]).unwrap();
        let want: Vec<f32> = (0..12).map(|i| i as f32 * 1.5).collect();
        assert_eq!(got["w"], want);
        assert_eq!(got["g"], vec![0.0, 1.5]);
    }

    #[test]
    fn an_element_no_holder_has_is_named() {
        let a = pieces_of(&el("w", &[0, 1, 2, 6, 7]));
        let e = merge([a]).unwrap_err();
        assert_eq!(
            (e.tensor.as_str(), e.first_missing, e.missing_end, e.len),
            ("w", 3, 6, 8)
        );
        assert!(e.to_string().contains("w: elements 3..6 of 8"), "{e}");
    }
}
