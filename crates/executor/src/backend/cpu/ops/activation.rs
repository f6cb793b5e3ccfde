//! MLP activations: SwiGLU (Shazeer 2020; input is [gate | up]) and GeLU (tanh approximation,
//! as GPT-2 and Megatron-LM).

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::ActivationOps;
use crate::error::ExecError;
use parsim_plan::plan::Activation;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)

/// out[n, f] from u[n, f] (GeLU) or u[n, 2f] (SwiGLU).
pub fn act_fwd(kind: Activation, u: &[f32], n: usize, f: usize, out: &mut [f32]) {
    match kind {
        Activation::Swiglu => {
            for r in 0..n {
                let (g, up) = u[r * 2 * f..(r + 1) * 2 * f].split_at(f);
                for j in 0..f {
                    out[r * f + j] = g[j] * sigmoid(g[j]) * up[j];
                }
            }
        }
        Activation::Gelu => {
            for (o, &x) in out.iter_mut().zip(u) {
                let t = (GELU_C * (x + 0.044715 * x * x * x)).tanh();
                *o = 0.5 * x * (1.0 + t);
            }
        }
    }
}

/// du from the saved input u and dout.
pub fn act_bwd(kind: Activation, u: &[f32], dout: &[f32], n: usize, f: usize, du: &mut [f32]) {
    match kind {
        Activation::Swiglu => {
            for r in 0..n {
                let (g, up) = u[r * 2 * f..(r + 1) * 2 * f].split_at(f);
                let (dg, dup) = du[r * 2 * f..(r + 1) * 2 * f].split_at_mut(f);
                for j in 0..f {
                    let s = sigmoid(g[j]);
                    let silu = g[j] * s;
                    let d = dout[r * f + j];
                    dup[j] = d * silu;
                    dg[j] = d * up[j] * s * (1.0 + g[j] * (1.0 - s));
                }
            }
        }
        Activation::Gelu => {
            for ((o, &x), &d) in du.iter_mut().zip(u).zip(dout) {
                let inner = GELU_C * (x + 0.044715 * x * x * x);
                let t = inner.tanh();
                let dinner = GELU_C * (1.0 + 3.0 * 0.044715 * x * x);
                *o = d * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner);
            }
        }
    }
}

/// `act_bwd` writing the gradient over the input (each output element reads only the input
/// elements it overwrites).
pub fn act_bwd_inplace(kind: Activation, u: &mut [f32], dout: &[f32], n: usize, f: usize) {
    match kind {
        Activation::Swiglu => {
            for r in 0..n {
                let (g, up) = u[r * 2 * f..(r + 1) * 2 * f].split_at_mut(f);
                for j in 0..f {
                    let s = sigmoid(g[j]);
                    let silu = g[j] * s;
                    let d = dout[r * f + j];
                    let dg = d * up[j] * s * (1.0 + g[j] * (1.0 - s));
                    up[j] = d * silu;
                    g[j] = dg;
                }
            }
        }
        Activation::Gelu => {
            for (x, &d) in u.iter_mut().zip(dout) {
                let v = *x;
                let inner = GELU_C * (v + 0.044715 * v * v * v);
                let t = inner.tanh();
                let dinner = GELU_C * (1.0 + 3.0 * 0.044715 * v * v);
                *x = d * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * dinner);
            }
        }
    }
}

impl ActivationOps<Cpu> for CpuOps {
    fn act_fwd(&self, kind: Activation, u: &Tensor, out: &mut Tensor) -> Result<(), ExecError> {
        let (n, f) = (out.rows(), out.cols());
        act_fwd(kind, u.data(), n, f, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut Tensor,
        dout: &Tensor,
    ) -> Result<(), ExecError> {
        let (n, f) = (dout.rows(), dout.cols());
        act_bwd_inplace(kind, u.data_mut(), dout.data(), n, f);
        store_all(u);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_backward_equals_the_out_of_place_one() {
        for kind in [Activation::Swiglu, Activation::Gelu] {
            let (n, f) = (3, 4);
            let w = if kind == Activation::Swiglu { 2 * f } else { f };
            let u: Vec<f32> = (0..n * w).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
            let dout: Vec<f32> = (0..n * f).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut du = vec![0.0; n * w];
            act_bwd(kind, &u, &dout, n, f, &mut du);
            let mut inplace = u.clone();
            act_bwd_inplace(kind, &mut inplace, &dout, n, f);
            assert_eq!(du, inplace);
        }
    }
}
