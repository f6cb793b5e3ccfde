//! Tensors of the CPU backend: a row-major buffer with a shape, a dtype and a memory category,
//! counted by the tracker of the rank that allocated it, from creation to drop. Tensors are
//! made by the rank's device ([`CpuOps`](super::device::CpuOps)). A bf16 tensor keeps its
//! elements as f32 values that are exactly bf16 numbers (every write rounds), and counts 2
//! bytes per element, as the device would hold it.

use crate::backend::bf16::round_bf16_slice;
use crate::backend::{DeviceTensor, View, ViewMut};

use crate::tracker::{Category, MemoryTracker};
use parsim_plan::DType;
use std::ops::Range;

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

/// Rounds `r` of `t` to bf16 when `t` is a bf16 tensor.
pub(super) fn store(t: &mut Tensor, r: Range<usize>) {
    if t.dtype() == DType::Bf16 {
        round_bf16_slice(&mut t.data_mut()[r]);
    }
}

/// [`store`] over a view's range.
pub(super) fn store_view(v: &mut ViewMut<'_, Tensor>) {
    let r = v.range.clone();
    store(v.tensor, r);
}

/// [`store`] over the whole tensor.
pub(super) fn store_all(t: &mut Tensor) {
    let n = t.len();
    store(t, 0..n);
}

/// The elements of a view.
pub(super) fn src<'a>(v: &'a View<'_, Tensor>) -> &'a [f32] {
    &v.tensor.data()[v.range.clone()]
}

/// The elements of a writable view.
pub(super) fn dst<'a>(v: &'a mut ViewMut<'_, Tensor>) -> &'a mut [f32] {
    &mut v.tensor.data_mut()[v.range.clone()]
}
