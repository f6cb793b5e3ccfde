//! fp32 tensors of the CPU backend: a row-major buffer with a shape and a memory category,
//! counted by the rank's tracker from creation to drop.

use crate::memory::{self, Category};

/// A tracked, row-major fp32 tensor.
pub struct Tensor {
    data: Vec<f32>,
    shape: Vec<usize>,
    cat: Category,
}

impl Tensor {
    /// A zero-filled tensor.
    #[track_caller]
    pub fn zeros(cat: Category, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec(cat, shape, vec![0.0; n])
    }

    /// Wraps `data` (its length must be the shape's product).
    #[track_caller]
    pub fn from_vec(cat: Category, shape: &[usize], data: Vec<f32>) -> Tensor {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "tensor data does not match shape {shape:?}"
        );
        memory::alloc(cat, 4 * data.len() as u64);
        Tensor {
            data,
            shape: shape.to_vec(),
            cat,
        }
    }

    /// A tracked copy of a slice.
    #[track_caller]
    pub fn copy_of(cat: Category, shape: &[usize], src: &[f32]) -> Tensor {
        Tensor::from_vec(cat, shape, src.to_vec())
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
        4 * self.data.len() as u64
    }

    pub fn category(&self) -> Category {
        self.cat
    }

    /// Moves the tensor to another category (e.g. a temporary that becomes a saved activation).
    #[track_caller]
    pub fn recat(mut self, cat: Category) -> Tensor {
        memory::free(self.cat, self.bytes());
        memory::alloc(cat, self.bytes());
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
        memory::free(self.cat, self.bytes());
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor{:?}({:?})", self.shape, self.cat)
    }
}
