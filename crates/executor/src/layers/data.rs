//! Synthetic token batches from a seed: sequence j holds seq + 1 tokens drawn uniformly from
//! the data vocabulary; inputs are the first seq, targets the last seq (next-token prediction).
//! Data-parallel rank d, microbatch i holds sequences (d * m + i) * b .. + b, so a one-rank run
//! with d * m microbatches sees the same sequences.

use super::blocks::uniform;
use parsim_plan::plan::ModelShape;

const DATA_STREAM: u64 = 0xDA7A;

fn token(seed: u64, vocab: usize, seq_len: usize, j: usize, pos: usize) -> u32 {
    let u = uniform(seed, DATA_STREAM, (j * (seq_len + 1) + pos) as u64);
    (((u + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as u32
}

/// (inputs, targets) of microbatch `mb` of data-parallel rank `dp_rank`, rows batch-major.
pub fn microbatch(
    m: &ModelShape,
    seed: u64,
    microbatches: u32,
    dp_rank: u32,
    mb: u32,
) -> (Vec<u32>, Vec<u32>) {
    shifted(m, seed, microbatches, dp_rank, mb, 0)
}

/// [`microbatch`] `shift` tokens ahead: position p's input is token p + shift and its target
/// token p + shift + 1 (multi-token prediction's depth k reads shift = k). Past a sequence's
/// seq + 1 tokens the stream continues into the next sequence's, so every position has its
/// target (Megatron rolls within the window instead and masks the last k positions out).
pub fn shifted(
    m: &ModelShape,
    seed: u64,
    microbatches: u32,
    dp_rank: u32,
    mb: u32,
    shift: usize,
) -> (Vec<u32>, Vec<u32>) {
    let first = (dp_rank as usize * microbatches as usize + mb as usize) * m.micro_batch;
    let mut x = Vec::with_capacity(m.tokens());
    let mut y = Vec::with_capacity(m.tokens());
    for j in first..first + m.micro_batch {
        for pos in shift..m.seq + shift {
            x.push(token(seed, m.data_vocab, m.seq, j, pos));
            y.push(token(seed, m.data_vocab, m.seq, j, pos + 1));
        }
    }
    (x, y)
}

/// The rows of a batch-major token list [b, seq] at `positions` of each sequence (a context-
/// parallel rank's share).
pub fn at_positions(x: &[u32], seq: usize, positions: &[u32]) -> Vec<u32> {
    x.chunks_exact(seq)
        .flat_map(|row| positions.iter().map(move |&p| row[p as usize]))
        .collect()
}
