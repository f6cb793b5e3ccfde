//! NCCL communicators and calls on device addresses. One process with several GPUs makes one
//! unique id per group and every member thread joins with `ncclCommInitRank`; a launched job
//! joins the world communicator with the id the launcher exchanged and splits one
//! communicator per process group (`ncclCommSplit`, colour = the group's index, key = the
//! member index). Point-to-point messages go in `ncclGroupStart`/`ncclGroupEnd` so that
//! paired sends and receives (pipeline exchanges, the variable all-to-all) never deadlock.

use crate::backend::cuda::comm::groups::GroupSpec;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::{require, Library};
use crate::backend::ReduceOp;
use cudarc::driver::sys::CUstream;
use cudarc::nccl::{result as nr, sys};
use parsim_plan::DType;
use std::ffi::c_void;

/// `NCCL_SPLIT_NOCOLOR` (nccl.h): the rank takes no part in the split.
const SPLIT_NOCOLOR: i32 = -1;

fn nccl_err(call: &'static str) -> impl Fn(nr::NcclError) -> CudaError {
    move |e| CudaError::call(Library::Nccl, call, format!("{e:?}"))
}

/// NCCL's element type for a tensor dtype.
pub fn nccl_type(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        DType::U8 => sys::ncclDataType_t::ncclUint8,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

/// Where each member's part starts in a buffer of consecutive parts of `counts` elements
/// (the send and receive offsets of a variable all-to-all).
pub fn displacements(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let at = *acc;
            *acc += c;
            Some(at)
        })
        .collect()
}

/// A fresh NCCL unique id (made by one member, handed to the others).
pub fn new_id() -> Result<[u8; 128], CudaError> {
    require(Library::Nccl)?;
    let id = nr::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
    Ok(id.internal.map(|c| c as u8))
}

/// One member's communicator.
pub struct NcclComm {
    comm: sys::ncclComm_t,
    pub size: usize,
    pub index: usize,
}

// SAFETY: a communicator is used by the one thread that runs its rank.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins the communicator of `size` members identified by `id` as member `index` (the
    /// calling thread's current CUDA context is the member's GPU).
    pub fn init(id: &[u8; 128], size: usize, index: usize) -> Result<NcclComm, CudaError> {
        require(Library::Nccl)?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new communicator; every member calls with the same id.
        unsafe { nr::comm_init_rank(&mut comm, size as i32, uid, index as i32) }
            .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(NcclComm { comm, size, index })
    }

    /// This rank's communicator for `spec` split from the world (`None` when it is not a
    /// member; every rank must call this for every group, in the same order).
    pub fn split(&self, spec: &GroupSpec, rank: u32) -> Result<Option<NcclComm>, CudaError> {
        let key = spec.members.iter().position(|&m| m == rank);
        let color = if key.is_some() {
            spec.color
        } else {
            SPLIT_NOCOLOR
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: a collective over the world communicator; a null config inherits the
        // parent's.
        unsafe {
            sys::ncclCommSplit(
                self.comm,
                color,
                key.unwrap_or(0) as i32,
                &mut comm,
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(nccl_err("ncclCommSplit"))?;
        Ok(key.map(|index| NcclComm {
            comm,
            size: spec.members.len(),
            index,
        }))
    }

    /// `count` elements at `send` summed (or maximised) into `recv` (may equal `send`).
    pub fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        d: DType,
        op: ReduceOp,
        s: CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: device buffers of `count` elements of `d`, live until the stream passes.
        unsafe {
            nr::all_reduce(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_type(d),
                nccl_op(op),
                self.comm,
                s.cast(),
            )
        }
        .map(drop)
        .map_err(nccl_err("ncclAllReduce"))
    }

    /// `recv` (`recv_count` elements) = this member's part of the sum of every `send`.
    pub fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        d: DType,
        s: CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: `send` holds size * recv_count elements, `recv` recv_count.
        unsafe {
            nr::reduce_scatter(
                send as *const c_void,
                recv as *mut c_void,
                recv_count,
                nccl_type(d),
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                s.cast(),
            )
        }
        .map(drop)
        .map_err(nccl_err("ncclReduceScatter"))
    }

    /// `recv` = every member's `send` (`send_count` each), in member order.
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        d: DType,
        s: CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: `recv` holds size * send_count elements.
        unsafe {
            nr::all_gather(
                send as *const c_void,
                recv as *mut c_void,
                send_count,
                nccl_type(d),
                self.comm,
                s.cast(),
            )
        }
        .map(drop)
        .map_err(nccl_err("ncclAllGather"))
    }

    /// In-place reductions in one NCCL group: for each `(root, address, count)` the sum over
    /// members of their `count` elements at `address` replaces the root's (the others' are
    /// left as they were). A reduce-scatter of a range into uneven contiguous shards, one
    /// piece per shard holder.
    pub fn reduce_to_roots(
        &self,
        pieces: &[(usize, u64, usize)],
        d: DType,
        s: CUstream,
    ) -> Result<(), CudaError> {
        grouped(pieces, |&(root, addr, count)| {
            // SAFETY: `addr` holds `count` elements until the stream passes; in place on the
            // root (NCCL allows sendbuff == recvbuff).
            unsafe {
                nr::reduce(
                    addr as *const c_void,
                    addr as *mut c_void,
                    count,
                    nccl_type(d),
                    sys::ncclRedOp_t::ncclSum,
                    root as i32,
                    self.comm,
                    s.cast(),
                )
            }
            .map(drop)
            .map_err(nccl_err("ncclReduce"))
        })
    }

    /// Sends and receives in one NCCL group: `(peer, address, count)` each.
    pub fn send_recv(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        d: DType,
        s: CUstream,
    ) -> Result<(), CudaError> {
        let calls: Vec<_> = (sends.iter().map(|&p| (true, p)))
            .chain(recvs.iter().map(|&p| (false, p)))
            .collect();
        grouped(&calls, |&(send, (peer, addr, count))| {
            let (t, peer) = (nccl_type(d), peer as i32);
            // SAFETY: a send's `addr` holds `count` elements until the stream passes, a
            // receive's has room for them.
            unsafe {
                if send {
                    let r = nr::send(addr as *const c_void, count, t, peer, self.comm, s.cast());
                    r.map(drop).map_err(nccl_err("ncclSend"))
                } else {
                    let r = nr::recv(addr as *mut c_void, count, t, peer, self.comm, s.cast());
                    r.map(drop).map_err(nccl_err("ncclRecv"))
                }
            }
        })
    }

    /// Variable all-to-all (counts in elements, member order) as grouped sends and receives.
    pub fn all_to_all_v(
        &self,
        send: u64,
        send_counts: &[usize],
        recv: u64,
        recv_counts: &[usize],
        d: DType,
        s: CUstream,
    ) -> Result<(), CudaError> {
        let b = d.size_bytes();
        let part = |base: u64, counts: &[usize]| -> Vec<(usize, u64, usize)> {
            displacements(counts)
                .into_iter()
                .zip(counts)
                .enumerate()
                .filter(|(_, (_, &c))| c > 0)
                .map(|(peer, (at, &c))| (peer, base + at as u64 * b, c))
                .collect()
        };
        self.send_recv(&part(send, send_counts), &part(recv, recv_counts), d, s)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created once by init or split, destroyed once; nothing to report to.
        let _ = unsafe { nr::comm_destroy(self.comm) };
    }
}

/// Makes one NCCL call per item inside one NCCL group. The group is always closed, even
/// after a failed call inside it; the first failure is the error.
fn grouped<T>(
    items: &[T],
    mut call: impl FnMut(&T) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    nr::group_start().map_err(nccl_err("ncclGroupStart"))?;
    let mut first_err = None;
    for it in items {
        // Every call is made (as NCCL expects of a group's members); the first error kept.
        if let Err(e) = call(it) {
            first_err.get_or_insert(e);
        }
    }
    let end = nr::group_end().map_err(nccl_err("ncclGroupEnd"));
    match first_err {
        Some(e) => Err(e),
        None => end.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displacements_are_exclusive_prefix_sums() {
        assert_eq!(displacements(&[3, 0, 2, 5]), [0, 3, 3, 5]);
        assert_eq!(displacements(&[]), Vec::<usize>::new());
        // The last part ends at the total.
        let c = [4, 1, 7];
        let d = displacements(&c);
        assert_eq!(d[2] + c[2], c.iter().sum::<usize>());
    }

    #[test]
    fn dtypes_map_to_nccl_types_of_the_same_width() {
        assert_eq!(nccl_type(DType::F32), sys::ncclDataType_t::ncclFloat32);
        assert_eq!(nccl_type(DType::Bf16), sys::ncclDataType_t::ncclBfloat16);
    }

    #[test]
    fn without_nccl_the_id_error_names_the_library() {
        if Library::Nccl.present() {
            eprintln!("skipped: NCCL is installed here");
            return;
        }
        let e = new_id().unwrap_err().to_string();
        assert!(e.contains("NCCL") && e.contains("libnccl"), "{e}");
    }
}
