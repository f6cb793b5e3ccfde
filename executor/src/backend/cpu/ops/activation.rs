//! MLP activations: SwiGLU (Shazeer 2020; input is [gate | up]) and GeLU (tanh approximation,
//! as GPT-2 and Megatron-LM).

use crate::plan::Activation;

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
