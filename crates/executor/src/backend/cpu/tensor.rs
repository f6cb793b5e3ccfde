//! Tensors of the CPU backend: a row-major buffer with a shape, a dtype and a memory category,
//! counted by the tracker of the rank that allocated it, from creation to drop. Tensors are
//! made by the rank's device ([`CpuOps`](super::CpuOps)). A bf16 tensor keeps its elements as
//! f32 values that are exactly bf16 numbers (every write rounds), and counts 2 bytes per
//! element, as the device would hold it.

use crate::backend::{DType, DeviceTensor};
use crate::tracker::{Category, MemoryTracker};

/// A tracked, row-major tensor.
pub struct Tensor {
    data: Vec<f32>,
    tracker: MemoryTracker,
    shape: Vec<usize>,
    cat: Category,
    dtype: DType,
}

impl DeviceTensor for Tensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn category(&self) -> Category {
        self.cat
    }
}

impl Tensor {
    /// Wraps `data` (its length must be the shape's product), counted by `tracker`.
    #[track_caller]
    pub(crate) fn new(
        tracker: &MemoryTracker,
        cat: Category,
        shape: &[usize],
        data: Vec<f32>,
    ) -> Tensor {
        Tensor::typed(tracker, cat, DType::F32, shape, data)
    }

    /// As [`Tensor::new`] with a dtype (a bf16 tensor's `data` must hold bf16 values).
    #[track_caller]
    pub(crate) fn typed(
        tracker: &MemoryTracker,
        cat: Category,
        dtype: DType,
        shape: &[usize],
        data: Vec<f32>,
    ) -> Tensor {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "tensor data does not match shape {shape:?}"
        );
        let bytes = dtype.size_bytes() * data.len() as u64;
        tracker.alloc(cat, bytes, bytes);
        Tensor {
            data,
            tracker: tracker.clone(),
            shape: shape.to_vec(),
            cat,
            dtype,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    pub fn cols(&self) -> usize {
        self.shape[1..].iter().product()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.dtype.size_bytes() * self.data.len() as u64
    }

    pub fn category(&self) -> Category {
        self.cat
    }

    /// Moves the tensor to another category (e.g. a temporary that becomes a saved activation).
    #[track_caller]
    pub fn recat(mut self, cat: Category) -> Tensor {
        let bytes = self.bytes();
        self.tracker.free(self.cat, bytes, bytes);
        self.tracker.alloc(cat, bytes, bytes);
        self.cat = cat;
        self
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        let bytes = self.bytes();
        self.tracker.free(self.cat, bytes, bytes);
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor{:?}({:?})", self.shape, self.cat)
    }
}
