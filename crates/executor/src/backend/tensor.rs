//! Device tensors as the model code sees them: what a tensor tells about itself
//! ([`DeviceTensor`]) and flat element ranges of one ([`View`], [`ViewMut`]).

use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::DType;
use std::ops::Range;

/// What every device tensor tells about itself.
pub trait DeviceTensor {
    fn shape(&self) -> &[usize];
    fn dtype(&self) -> DType;
    fn category(&self) -> Category;
    /// Elements.
    fn len(&self) -> usize {
        self.shape().iter().product()
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rows (the first dimension).
    fn rows(&self) -> usize {
        self.shape().first().copied().unwrap_or(0)
    }
    /// Elements per row.
    fn cols(&self) -> usize {
        self.shape().iter().skip(1).product()
    }
    /// Bytes the tensor's elements take.
    fn size_bytes(&self) -> u64 {
        self.len() as u64 * self.dtype().size_bytes()
    }
}

/// Elements `range` of a tensor seen flat: a parameter of a flat buffer, a ZeRO shard, a row
/// block.
#[derive(Debug)]
pub struct View<'t, T> {
    pub tensor: &'t T,
    pub range: Range<usize>,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        View {
            tensor: self.tensor,
            range: self.range.clone(),
        }
    }
}

impl<'t, T: DeviceTensor> View<'t, T> {
    /// The whole tensor.
    pub fn all(tensor: &'t T) -> View<'t, T> {
        View {
            range: 0..tensor.len(),
            tensor,
        }
    }

    /// Elements `r` of this view (relative to its start).
    pub fn sub(&self, r: Range<usize>) -> View<'t, T> {
        debug_assert!(r.end <= self.range.len());
        View {
            tensor: self.tensor,
            range: self.range.start + r.start..self.range.start + r.end,
        }
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// Writable elements `range` of a tensor seen flat: a gradient slice, a shard.
#[derive(Debug)]
pub struct ViewMut<'t, T> {
    pub tensor: &'t mut T,
    pub range: Range<usize>,
}

impl<'t, T: DeviceTensor> ViewMut<'t, T> {
    /// The whole tensor.
    pub fn all(tensor: &'t mut T) -> ViewMut<'t, T> {
        ViewMut {
            range: 0..tensor.len(),
            tensor,
        }
    }

    /// Elements `r` of this view (relative to its start), reborrowed.
    pub fn sub(&mut self, r: Range<usize>) -> ViewMut<'_, T> {
        debug_assert!(r.end <= self.range.len());
        ViewMut {
            range: self.range.start + r.start..self.range.start + r.end,
            tensor: self.tensor,
        }
    }

    /// The same elements, reborrowed.
    pub fn reborrow(&mut self) -> ViewMut<'_, T> {
        ViewMut {
            range: self.range.clone(),
            tensor: self.tensor,
        }
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// [`Device::upload`](super::Device::upload)'s rule, the same on every backend: `len` values
/// fill a tensor of `shape` exactly.
pub fn check_upload(shape: &[usize], len: usize) -> Result<(), ExecError> {
    let n: usize = shape.iter().product();
    if n == len {
        return Ok(());
    }
    Err(ExecError::Shape {
        op: "upload",
        rule: format!("{len} values for a tensor of shape {shape:?}"),
    })
}

/// [`TensorOps::copy`](super::TensorOps::copy)'s rule, the same on every backend: the source
/// and destination views hold as many elements.
pub fn check_copy(src_len: usize, dst_len: usize) -> Result<(), ExecError> {
    if src_len == dst_len {
        return Ok(());
    }
    Err(ExecError::Shape {
        op: "copy",
        rule: format!("{src_len} elements into {dst_len}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_and_copy_refuse_sizes_that_do_not_match_naming_the_call() {
        assert!(check_upload(&[2, 3], 6).is_ok());
        assert!(check_upload(&[0, 3], 0).is_ok());
        let e = check_upload(&[2, 3], 5).unwrap_err().to_string();
        assert_eq!(e, "upload: 5 values for a tensor of shape [2, 3]");
        assert!(check_copy(4, 4).is_ok());
        let e = check_copy(4, 6).unwrap_err().to_string();
        assert_eq!(e, "copy: 4 elements into 6");
    }
}
